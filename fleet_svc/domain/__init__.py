"""Pure fleet rules: catalog revisions, placement, replica phases, the plan; no I/O, no clock."""
