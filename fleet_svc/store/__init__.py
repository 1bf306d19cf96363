"""Where the fleet keeps what it accepted: one interface, SQLite (later PostgreSQL) behind it."""
