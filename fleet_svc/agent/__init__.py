"""The node agent: reports its node's cards and replicas, runs the engines it is told to."""
