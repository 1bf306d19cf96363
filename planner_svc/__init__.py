"""The planner service: sizes contexts and cards from a model's shape and the inventory."""
