"""The engines llmgw serves models with, one module each behind one protocol (`base.Engine`)
and one registry (`registry`): their flag grammars, how a context and a card count are
written into their arguments, their KV caches, overheads and budgets, and how they split a
model over cards. Pure: the planner and the node agent both use it."""
