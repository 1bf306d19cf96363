"""The fleet service: the model catalog, the nodes and the replicas on them."""
