"""Authentication and authorization shared by the fleet and the planner: the pure rules
(`policy`), the live files they rest on (`files`), and the call guard (`guard`)."""
