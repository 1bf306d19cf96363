"""The node agent's proto edge: the agent protocol's messages to and from the agent's own values."""
