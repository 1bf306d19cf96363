"""Generated protobuf code for llmgw's contract (see protos/)."""
