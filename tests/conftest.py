"""Fixtures shared across the test suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing.range_server import RangeServer


@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[RangeServer]:
    """A range-serving HTTP server on 127.0.0.1 for the files a test writes under `tmp_path`."""
    with RangeServer(tmp_path) as server:
        yield server


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the PostgreSQL server the run started for its store tests, if it started one."""
    from tests.support.postgres import stop_own_server

    stop_own_server()
