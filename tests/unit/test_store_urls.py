"""What `--store` values name, and DSNs printed without their passwords."""

from __future__ import annotations

import pytest

from fleet_svc.store.urls import is_postgres, redact_dsn

REDACTIONS = [
    (
        "postgresql://fleet:s3cret@db.internal:5432/fleet",
        "postgresql://fleet:***@db.internal:5432/fleet",
    ),
    ("postgresql://fleet@db.internal/fleet", "postgresql://fleet@db.internal/fleet"),
    ("postgresql://db.internal/fleet", "postgresql://db.internal/fleet"),
    (
        "postgresql://fleet@db/fleet?sslmode=verify-full&password=s3cret",
        "postgresql://fleet@db/fleet?sslmode=verify-full&password=***",
    ),
    ("postgresql://fleet:p%40ss@db/fleet", "postgresql://fleet:***@db/fleet"),
    (
        "host=db user=fleet password=s3cret dbname=fleet",
        "host=db user=fleet password=*** dbname=fleet",
    ),
    ("host=db password = 'a b\\' c' dbname=fleet", "host=db password = *** dbname=fleet"),
    ("host=db PASSWORD=s3cret", "host=db PASSWORD=***"),
]


@pytest.mark.parametrize(("dsn", "shown"), REDACTIONS, ids=[r[1] for r in REDACTIONS])
def test_a_dsn_is_shown_without_its_password(dsn: str, shown: str) -> None:
    """A password in the URL's user part, its query or a libpq keyword is replaced by ***;
    everything else (user, host, port, database, options) is kept for the reader."""
    assert redact_dsn(dsn) == shown


@pytest.mark.parametrize(
    ("url", "postgres"),
    [
        ("postgresql://fleet@db/fleet", True),
        ("postgres://fleet@db/fleet", True),
        ("postgresql+psycopg://fleet@db/fleet", True),
        ("sqlite:///var/lib/llmgw/fleet.db", False),
        ("data/fleet.db", False),
        ("mysql://fleet@db/fleet", False),
    ],
)
def test_postgresql_urls_are_told_from_files(url: str, postgres: bool) -> None:
    """The PostgreSQL schemes (and SQLAlchemy's postgresql+driver spelling) name a database;
    anything else is a file or refused."""
    assert is_postgres(url) is postgres
