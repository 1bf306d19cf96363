"""The SQLite store's fleet state: replicas, and rollouts with their events and requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet_svc.store.base import EventRecord, ReplicaRecord, RolloutRecord, RolloutRequest
from fleet_svc.store.codec import (
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    dump_json,
    event_of_row,
    replica_of_row,
    request_of_row,
    rollout_filter,
    rollout_of_row,
)
from fleet_svc.store.migrations import immediate
from fleet_svc.store.sqlite_calls import SQLiteCalls, guarded


class StateCalls(SQLiteCalls):
    """The Store's calls on replicas and rollouts (base.Store)."""

    # Replicas.

    @guarded
    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record, by id."""
        rows = self._conn.execute(f"SELECT {REPLICA_COLUMNS} FROM replicas ORDER BY id").fetchall()
        return [replica_of_row(self.where, row) for row in rows]

    @guarded
    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        """Insert or replace `puts` and forget `deletes` in one transaction: one sync to disk
        for a whole tick's changes instead of one per replica."""
        if not puts and not deletes:
            return
        # Replicas of one profile share their spec's dict (fleet_svc.store.rows): it is
        # dumped once. The records hold the dicts for the call, so no id is reused.
        specs: dict[int, str] = {}
        rows = [_replica_row(record, specs) for record in puts]
        with immediate(self._conn):
            self._conn.executemany(_PUT_REPLICA, rows)
            self._conn.executemany("DELETE FROM replicas WHERE id = ?", [(rid,) for rid in deletes])

    @guarded
    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert a replica record, or replace every field of the one with the same id."""
        self._conn.execute(_PUT_REPLICA, _replica_row(record, {}))

    @guarded
    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (deleting an unknown id does nothing)."""
        self._conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))

    # Rollouts.

    @guarded
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert a rollout, or replace its state (created_at is kept)."""
        self._conn.execute(
            "INSERT INTO rollouts (id, model, state, spec, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
            " spec = excluded.spec, updated_at = excluded.updated_at",
            (
                record.id,
                record.model,
                record.state,
                dump_json(record.spec),
                record.created_at,
                record.updated_at,
            ),
        )

    @guarded
    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""
        row = self._conn.execute(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)
        ).fetchone()
        return None if row is None else rollout_of_row(self.where, row)

    @guarded
    def list_rollouts(self, model: str = "", *, states: Sequence[str] = ()) -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first; only those in `states`
        when given."""
        where, params = rollout_filter(model, states, "?")
        rows = self._conn.execute(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY created_at DESC, id DESC",
            params,
        ).fetchall()
        return self._readable(rows, rollout_of_row)

    # Requests of rollouts.

    @guarded
    def put_rollout_request(self, request: RolloutRequest) -> None:
        """Record a request (a repeated id is ignored)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO rollout_requests"
            " (id, rollout_id, kind, reason, requested_by, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                request.id,
                request.rollout_id,
                request.kind,
                request.reason,
                request.by,
                request.created_at,
            ),
        )

    @guarded
    def list_rollout_requests(self) -> list[RolloutRequest]:
        """Every request not yet carried out, oldest first."""
        rows = self._conn.execute(
            "SELECT id, rollout_id, kind, reason, requested_by, created_at FROM rollout_requests"
            " ORDER BY created_at, id"
        ).fetchall()
        return [request_of_row(row) for row in rows]

    @guarded
    def delete_rollout_requests(self, ids: Sequence[str]) -> None:
        """Forget requests the controller carried out."""
        self._conn.executemany("DELETE FROM rollout_requests WHERE id = ?", [(i,) for i in ids])

    @guarded
    def append_event(self, rollout_id: str, at: float, event: dict[str, Any]) -> int:
        """Append an event; the seq is the rollout's last plus one, taken under the write lock."""
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM rollout_events WHERE rollout_id = ?",
                (rollout_id,),
            ).fetchone()
            seq = int(row[0]) + 1
            self._conn.execute(
                "INSERT INTO rollout_events (rollout_id, seq, at, event) VALUES (?, ?, ?, ?)",
                (rollout_id, seq, at, dump_json(event)),
            )
        return seq

    @guarded
    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order."""
        rows = self._conn.execute(
            "SELECT rollout_id, seq, at, event FROM rollout_events"
            " WHERE rollout_id = ? AND seq > ? ORDER BY seq",
            (rollout_id, after_seq),
        ).fetchall()
        return self._readable(rows, event_of_row)


_PUT_REPLICA = (
    f"INSERT INTO replicas ({REPLICA_COLUMNS})"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET model = excluded.model,"
    " profile = excluded.profile, revision = excluded.revision, node = excluded.node,"
    " gpus = excluded.gpus, phase = excluded.phase, reason = excluded.reason,"
    " address = excluded.address, restarts = excluded.restarts, since = excluded.since,"
    " spec = excluded.spec, members = excluded.members, progress = excluded.progress"
)


def _replica_row(record: ReplicaRecord, specs: dict[int, str]) -> tuple[Any, ...]:
    """A replica record's row (`specs`: the spec dicts dumped so far, by id)."""
    spec = specs.get(id(record.spec))
    if spec is None:
        spec = specs[id(record.spec)] = dump_json(record.spec)
    return (
        record.id,
        record.model,
        record.profile,
        record.revision,
        record.node,
        dump_json(list(record.gpus)),
        record.phase,
        record.reason,
        record.address,
        record.restarts,
        record.since,
        spec,
        dump_json(list(record.members)),
        dump_json(record.progress),
    )
