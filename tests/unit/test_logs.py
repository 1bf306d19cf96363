"""One log stream: a real child process configured as every service is (llmgw.logs) writes
only JSON lines to stderr, the standard library's records among them."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap

import pytest
import structlog

from llmgw import logs

PROGRAM = textwrap.dedent(
    """
    import logging, warnings
    import structlog
    from llmgw.logs import configure_logging

    configure_logging(True)
    structlog.get_logger("llmgw.test").info("from_structlog", answer=42)
    logging.getLogger("psycopg.pool").warning("error connecting in %r", "pool-1")
    logging.getLogger("psycopg.pool").info("too chatty to write")
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("opentelemetry.exporter").exception("export failed")
    warnings.warn("old thing", DeprecationWarning, stacklevel=1)
    """
)


def test_stdlib_records_come_out_as_json_lines() -> None:
    """Every stderr line parses as JSON: structlog's event, a psycopg_pool warning (its
    message formatted, its logger named), an exception with its traceback, and a Python
    warning; an INFO record of a library is below the threshold."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # a bare line would not parse
    by_event = {e["event"].splitlines()[0] if "\n" in e["event"] else e["event"]: e for e in events}
    assert by_event["from_structlog"]["answer"] == 42
    pool = by_event["error connecting in 'pool-1'"]
    assert pool["logger"] == "psycopg.pool" and pool["level"] == "warning" and "timestamp" in pool
    failed = by_event["export failed"]
    assert failed["level"] == "error" and "ZeroDivisionError" in failed["exception"]
    assert any(e.get("logger") == "py.warnings" and "old thing" in e["event"] for e in events)
    assert not any("too chatty" in e["event"] for e in events)
    assert len(events) == 4


class _Named:
    """A value that names itself for structlog."""

    def __structlog__(self) -> str:
        return "named"


class _Opaque:
    """A value json cannot encode and that does not name itself."""

    def __repr__(self) -> str:
        return "<opaque>"


EVENTS: list[dict[str, object]] = [
    {"event": "context_sized", "model": "m", "before": 8192, "after": 50000, "level": "info"},
    {"event": 'é ✓ "quoted" \n', "ratio": 0.1 + 0.2, "big": 1 << 70, "none": None},
    {"event": "nested", "list": [1, "a", {"b": [True, False]}], "t": (1, 2)},
    {"event": "objects", "named": _Named(), "opaque": _Opaque(), "nan": float("nan")},
]


def test_json_line_is_the_text_structlog_json_renderer_writes() -> None:
    """Each event comes out as the very text structlog's own JSONRenderer writes for it:
    non-ASCII, floats, nesting, and values json cannot encode (named or repr'd) alike."""
    theirs = structlog.processors.JSONRenderer()
    ours = logs.JsonLine()
    for event in EVENTS:
        assert ours(None, "info", dict(event)) == theirs(None, "info", dict(event))


def test_utc_stamp_is_the_text_of_an_iso_timestamp_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timestamp is the instant's ISO 8601 text in UTC with a "Z", as structlog's
    TimeStamper(fmt="iso") writes it (microseconds truncated, left out when 0), within a
    second, across seconds and back again."""
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    stamp = logs.UtcStamp()
    base = 1_796_300_000 * 10**9
    instants = [
        base,
        base + 1_999,
        base + 123_456_789,
        base + 999_999_999,
        base + 10**9,
        base + 10**9 + 1_000,
        base + 86_400 * 10**9 + 500_000_000,
        base + 7,
    ]
    for ns in instants:
        monkeypatch.setattr("llmgw.logs.time.time_ns", lambda ns=ns: ns)
        at = epoch + datetime.timedelta(microseconds=ns // 1000)
        expected = at.isoformat().replace("+00:00", "Z")
        assert stamp(None, "info", {})["timestamp"] == expected, ns
