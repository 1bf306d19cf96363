"""Pure fleet rules: catalog revisions, placement, replica phases, the control plan; no I/O, no clock."""
