"""A starting replica's progress for people: the PROGRESS column of `llmgw ctl replica list`
and the progress lines of `replica watch`, which follows the replicas starting beside the
ready endpoints' stream."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from llmgw.clients import ClientError, FleetClient
from llmgw.clients.convert import Replica, as_data, enum_name

Emit = Callable[[Any, str | None], None]
"""Prints one item of a stream: its data (for `-o json|yaml|jsonpath`) or its line."""

POLL_S = 1.0
"""How often `replica watch` asks the fleet for its starting replicas: as often as an agent
reports a replica's progress (fleet_svc.agent.progress.INTERVAL_S)."""


def size(n: int) -> str:
    """Bytes for people, in decimal units as download tools show them: 640 kB, 120 MB, 4.2 GB."""
    if n < 1_000_000:
        return f"{n / 1e3:.0f} kB"
    if n < 1_000_000_000:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e9:.1f} GB"


def duration(seconds: float) -> str:
    """A duration for people: 42s, 3m10s, 2h05m."""
    s = max(int(seconds + 0.5), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(r: Replica) -> str:
    """A replica's progress in one cell: `downloading 45% 120 MB/268 MB 12 MB/s eta 12s`,
    `downloading 120 MB` (the total not known), `loading`; '-' when it reports none."""
    if not r.HasField("progress"):
        return "-"
    p = r.progress
    stage = enum_name(p, "stage").removeprefix("START_STAGE_")
    if stage == "LOADING":
        return "loading"
    if stage != "DOWNLOADING":
        return "-"
    parts = ["downloading"]
    if p.total_bytes > 0:
        parts.append(f"{min(p.done_bytes * 100 // p.total_bytes, 100)}%")
        parts.append(f"{size(p.done_bytes)}/{size(p.total_bytes)}")
    else:
        parts.append(size(p.done_bytes))
    if p.files_total > 1:
        parts.append(f"file {min(p.files_done + 1, p.files_total)}/{p.files_total}")
    if p.rate_bytes_per_s > 0:
        parts.append(f"{size(p.rate_bytes_per_s)}/s")
        if p.total_bytes > p.done_bytes:
            parts.append("eta " + duration((p.total_bytes - p.done_bytes) / p.rate_bytes_per_s))
    return " ".join(parts)


class ProgressFollower:
    """Polls the fleet every `POLL_S` for replicas that report progress, and prints a line for
    each whose progress changed (in a thread of its own, beside a watch's stream).

    Args:
        fleet: the client to ask (its channel is shared with the watch's stream).
        model: only this model's replicas ("" for every model's).
        emit: prints one item as the watch's printer does (`Printer.event`: data, line).
        lock: held while printing, as the watch holds it for its own events.
    """

    def __init__(self, fleet: FleetClient, model: str, emit: Emit, lock: threading.Lock) -> None:
        self._fleet = fleet
        self._model = model
        self._emit = emit
        self._lock = lock
        self._shown: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> None:
        """Begin polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the thread ends within one poll)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                replicas = list(self._fleet.list_replicas(self._model).replicas)
            except ClientError:
                replicas = []  # the watch's own stream says when the fleet is gone
            self.show(replicas)
            self._stop.wait(POLL_S)

    def show(self, replicas: list[Replica]) -> None:
        """Print each replica whose progress text changed since the last poll."""
        for r in replicas:
            text = progress_text(r)
            if text == "-" or self._shown.get(r.id) == text:
                continue
            self._shown[r.id] = text
            data = {"kind": "PROGRESS", "replica": as_data(r)}
            line = f"PROGRESS {r.model}/{r.profile} {r.id} node={r.node or '-'} {text}"
            with self._lock:
                if not self._stop.is_set():
                    self._emit(data, line)
        gone = set(self._shown) - {r.id for r in replicas if progress_text(r) != "-"}
        for rid in gone:
            del self._shown[rid]
