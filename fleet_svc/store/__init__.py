"""Where the fleet keeps what it accepted: one interface, SQLite (and later PostgreSQL) behind it."""
