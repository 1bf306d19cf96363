"""Pure planning rules: shapes, memory, engine arguments; no I/O, no clock."""
