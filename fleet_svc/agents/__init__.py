"""The fleet side of the agents' streams."""
