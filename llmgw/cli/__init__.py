"""The `llmgw` command line."""
