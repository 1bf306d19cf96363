"""The PostgreSQL store's traffic reports: each gateway's report of an interval, kept once
for the canary analysis."""

from __future__ import annotations

from collections.abc import Sequence

from fleet_svc.store.base import TrafficRecord
from fleet_svc.store.codec import TRAFFIC_COLUMNS, traffic_of_row, traffic_row
from fleet_svc.store.postgres_calls import PostgresCalls, guarded


class TrafficCalls(PostgresCalls):
    """The Store's calls on traffic reports (base.Store)."""

    @guarded
    def put_traffic(self, records: Sequence[TrafficRecord], *, prune_before_ms: int) -> bool:
        """Keep one gateway's report of one interval once (False: it was kept before); the
        first row's key decides under the insert's own conflict check, so two fleets taking
        the same report at once keep it once."""
        if not records:
            return True
        first = records[0]
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute(
                "DELETE FROM traffic_reports WHERE interval_start_ms < %s", (prune_before_ms,)
            )
            # Serialize reports of one (gateway, interval): the second waits, then sees it.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (f"traffic/{first.gateway}/{first.interval_start_ms}",),
            )
            seen = conn.execute(
                "SELECT 1 FROM traffic_reports WHERE gateway = %s AND interval_start_ms = %s"
                " LIMIT 1",
                (first.gateway, first.interval_start_ms),
            ).fetchone()
            if seen is not None:
                return False
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO traffic_reports ({TRAFFIC_COLUMNS})"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s::json, %s)",
                    [traffic_row(r) for r in records],
                )
        return True

    @guarded
    def list_traffic(self, model: str, since_ms: int) -> list[TrafficRecord]:
        """The model's traffic records of intervals that began at or after `since_ms`."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {TRAFFIC_COLUMNS} FROM traffic_reports"
                " WHERE model = %s AND interval_start_ms >= %s"
                " ORDER BY interval_start_ms, gateway",
                (model, since_ms),
            ).fetchall()
        return self._readable(rows, traffic_of_row)
