"""The proto edges shared by every service: the contract's common messages to and from the
typed values of `llmgw.model` and `llmgw.shape`."""
