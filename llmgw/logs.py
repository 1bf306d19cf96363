"""Logging for every llmgw process: structlog configured once, in each `__main__`, and the
standard library's loggers (psycopg_pool, the OTLP exporter, asyncio, Python's warnings)
routed through the same processors (structlog's ProcessorFormatter), so every line a process
writes to stderr is one JSON object in production mode, or one console line at a terminal.

A standard-library record keeps its logger's name (`logger`), its level and its exception
(`exception`, the formatted traceback); its level threshold is WARNING (INFO of those libraries
is each request or connection), structlog's own is INFO.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import structlog

from llmgw.tracing import add_trace_ids

STDLIB_LEVEL = logging.WARNING
"""The least severe standard-library record written."""


def _structlog_default(obj: Any) -> Any:
    """What a JSON line writes for a value json cannot encode: its `__structlog__()`, else its
    repr (structlog's JSONRenderer's fallback)."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


class JsonLine:
    """structlog processor: the event as one JSON object, the same text as structlog's
    `JSONRenderer()` (`json.dumps(event, default=...)`), from one encoder built once: `dumps`
    with an argument builds a new encoder for every line, a third of the line's cost."""

    def __init__(self) -> None:
        self._encode = json.JSONEncoder(default=_structlog_default).encode

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> str:
        return self._encode(event)


class UtcStamp:
    """structlog processor: `timestamp`, the time now in UTC as ISO 8601 with a "Z", the same
    text as structlog's `TimeStamper(fmt="iso")` (`datetime.now(utc).isoformat()`:
    microseconds truncated, left out when 0), its date and seconds formatted once a second."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        second, micro = divmod(time.time_ns() // 1000, 1_000_000)
        kept, text = self._second
        if kept != second:
            at = datetime.datetime.fromtimestamp(second, tz=datetime.UTC)
            text = at.isoformat()[:19]  # YYYY-MM-DDTHH:MM:SS
            self._second = (second, text)
        event["timestamp"] = f"{text}.{micro:06d}Z" if micro else f"{text}Z"
        return event


def configure_logging(json_logs: bool) -> None:
    """structlog, once: JSON lines in production, readable lines at a terminal; context
    variables (model, rollout_id, node) merged into every event, and inside a traced call
    its trace and span ids (llmgw.tracing); the root logger of the standard library writes
    through the same renderer."""
    renderer: structlog.types.Processor = (
        JsonLine() if json_logs else structlog.dev.ConsoleRenderer()
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        UtcStamp(),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Each module's logger binds its processors once, on its first line, not on every
        # line (configured once per process, before any line is written).
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(STDLIB_LEVEL)
    logging.captureWarnings(True)
