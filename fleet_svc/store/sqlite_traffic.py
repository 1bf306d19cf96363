"""The SQLite store's traffic reports: each gateway's report of an interval, kept once for the
canary analysis."""

from __future__ import annotations

from collections.abc import Sequence

from fleet_svc.store.base import TrafficRecord
from fleet_svc.store.codec import TRAFFIC_COLUMNS, traffic_of_row, traffic_row
from fleet_svc.store.migrations import immediate
from fleet_svc.store.sqlite_calls import SQLiteCalls, guarded


class TrafficCalls(SQLiteCalls):
    """The Store's calls on traffic reports (base.Store)."""

    @guarded
    def put_traffic(self, records: Sequence[TrafficRecord], *, prune_before_ms: int) -> bool:
        """Keep one gateway's report of one interval once (False: it was kept before)."""
        if not records:
            return True
        first = records[0]
        with immediate(self._conn):
            self._conn.execute(
                "DELETE FROM traffic_reports WHERE interval_start_ms < ?", (prune_before_ms,)
            )
            seen = self._conn.execute(
                "SELECT 1 FROM traffic_reports WHERE gateway = ? AND interval_start_ms = ? LIMIT 1",
                (first.gateway, first.interval_start_ms),
            ).fetchone()
            if seen is not None:
                return False
            self._conn.executemany(
                f"INSERT INTO traffic_reports ({TRAFFIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [traffic_row(r) for r in records],
            )
        return True

    @guarded
    def list_traffic(self, model: str, since_ms: int) -> list[TrafficRecord]:
        """The model's traffic records of intervals that began at or after `since_ms`."""
        rows = self._conn.execute(
            f"SELECT {TRAFFIC_COLUMNS} FROM traffic_reports"
            " WHERE model = ? AND interval_start_ms >= ? ORDER BY interval_start_ms, gateway",
            (model, since_ms),
        ).fetchall()
        return self._readable(rows, traffic_of_row)
