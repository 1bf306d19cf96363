"""Logging for every llmgw process: structlog configured once, in each `__main__`."""

from __future__ import annotations

import logging
import sys

import structlog

from llmgw.tracing import add_trace_ids


def configure_logging(json_logs: bool) -> None:
    """structlog, once: JSON lines in production, readable lines at a terminal; context
    variables (model, rollout_id, node) merged into every event, and inside a traced call
    its trace and span ids (llmgw.tracing)."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Each module's logger binds its processors once, on its first line, not on every
        # line (configured once per process, before any line is written).
        cache_logger_on_first_use=True,
    )
