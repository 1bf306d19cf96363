"""Logging for every llmgw process: structlog configured once, in each `__main__`, and the
standard library's loggers (psycopg_pool, the OTLP exporter, asyncio, Python's warnings)
routed through the same processors (structlog's ProcessorFormatter), so every line a process
writes to stderr is one JSON object in production mode, or one console line at a terminal.

A standard-library record keeps its logger's name (`logger`), its level and its exception
(`exception`, the formatted traceback); its level threshold is WARNING (INFO of those libraries
is each request or connection), structlog's own is INFO.
"""

from __future__ import annotations

import logging
import sys

import structlog

from llmgw.tracing import add_trace_ids

STDLIB_LEVEL = logging.WARNING
"""The least severe standard-library record written."""


def configure_logging(json_logs: bool) -> None:
    """structlog, once: JSON lines in production, readable lines at a terminal; context
    variables (model, rollout_id, node) merged into every event, and inside a traced call
    its trace and span ids (llmgw.tracing); the root logger of the standard library writes
    through the same renderer."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
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
