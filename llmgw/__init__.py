"""llmgw's contract and command line."""
