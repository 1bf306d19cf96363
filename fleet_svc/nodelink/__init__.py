"""The fleet's link to the nodes' agents: the desired sets it sends them, the nodes whose
streams another fleet holds, and the node reports those fleets store."""
