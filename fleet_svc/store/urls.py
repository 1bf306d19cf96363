"""Which store a `--store` value names, opening it checked, and DSNs fit to print."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fleet_svc.store.base import Store

_POSTGRES_SCHEMES = ("postgresql", "postgres")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
REDACTED = "***"


def redact_dsn(dsn: str) -> str:
    """A PostgreSQL DSN with its password (in the URL's user part, its query, or a libpq
    `password=` keyword) replaced by ***, for messages and logs."""
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(lambda m: m.group(1) + REDACTED, dsn)
    parts = urlsplit(dsn)
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{hostport}"
    query = parts.query
    if query:
        pairs = [
            (k, REDACTED if k.lower() == "password" else v)
            for k, v in parse_qsl(query, keep_blank_values=True)
        ]
        query = urlencode(pairs, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def is_postgres(url: str) -> bool:
    """Whether a store URL names a PostgreSQL database."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and (scheme in _POSTGRES_SCHEMES or scheme.startswith("postgresql+"))


def open_store(url: str, *, verify: bool = True) -> Store:
    """Open the store a URL names, and (unless `verify` is False) check every row reads.

    Args:
        url: `postgresql://user@host:5432/db` (or `postgres://`, `postgresql+psycopg://`);
            `sqlite:///abs/path.db` (absolute), `sqlite://relative.db` (relative to the working
            folder), or a plain file path.
        verify: run the store's `verify` before handing it out (the fleet always does).

    Returns:
        The opened store.

    Raises:
        ValueError: the URL names no file, or a database this build cannot open.
        StoreError: the store cannot be reached, is damaged, or has a newer schema (the message
            names the file or the DSN, its password left out).
    """
    scheme, sep, rest = url.partition("://")
    store: Store
    if is_postgres(url):
        # Imported here: a fleet on SQLite never loads the PostgreSQL driver.
        from fleet_svc.store.postgres import PostgresStore

        store = PostgresStore("postgresql://" + rest)
    else:
        if not sep:
            path = url
        elif scheme == "sqlite":
            path = rest
        else:
            raise ValueError(
                f"unknown store URL scheme {scheme!r}; give postgresql://user@host/db,"
                " sqlite:///abs/path.db, sqlite://relative.db or a file path"
            )
        if not path:
            raise ValueError(
                f"store URL {url!r} names no file; give sqlite:///abs/path.db or a path"
            )
        from fleet_svc.store.sqlite import SQLiteStore

        store = SQLiteStore(path)
    if verify:
        try:
            store.verify()
        except BaseException:
            store.close()
            raise
    return store
