"""One log stream: a real child process configured as every service is (llmgw.logs) writes
only JSON lines to stderr, the standard library's records among them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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
