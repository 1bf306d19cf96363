"""The PostgreSQL store's fleet state: replicas, rollouts with their events and requests, and
the channel that tells the fleets following when any of them changed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import structlog

from fleet_svc.store.base import EventRecord, ReplicaRecord, RolloutRecord, RolloutRequest
from fleet_svc.store.codec import (
    EVENT_COLUMNS,
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    dump_json,
    event_of_row,
    replica_of_row,
    request_of_row,
    rollout_filter,
    rollout_of_row,
)
from fleet_svc.store.postgres_batch import BatchingConnection
from fleet_svc.store.postgres_calls import PostgresCalls, guarded, once
from fleet_svc.store.postgres_link import first_line

log = structlog.get_logger(__name__)

STATE_CHANNEL = "llmgw_fleet_state"
"""The channel every write of replicas and rollouts notifies (at its commit), and fleets that
follow listen on (`PostgresStore.listen`)."""
LISTEN_POLL_S = 1.0
"""How long a listener waits for a notification before it checks whether to stop."""
LISTEN_RETRY_S = 1.0
"""How long a listener whose connection broke waits before connecting again."""


class StateCalls(PostgresCalls):
    """The Store's calls on replicas and rollouts (base.Store), and the following fleets' view
    of them (`state_digest`, `listen`)."""

    @guarded
    def state_digest(self) -> str:
        """A digest of every replica and rollout row, computed by the server (no row leaves
        it): a fleet that follows reads those rows again only when this changed."""
        with self.link.connection() as conn:
            row = conn.execute(_STATE_DIGEST).fetchone()
        return "" if row is None else f"{row[0]}/{row[1]}"

    def listen(self, changed: Callable[[str], None], stop: threading.Event) -> None:
        """Call `changed` with the notification's payload whenever a write of replicas,
        rollouts (payload "") or desired sets (base.DESIRED) commits (LISTEN on STATE_CHANNEL over a
        connection of its own), and with "" once each time it (re)connects, since
        notifications sent while it was away are lost; until `stop` is set. Blocks: run it on a
        thread. A broken connection is logged and made again after LISTEN_RETRY_S."""
        failing = ""
        while not stop.is_set():
            try:
                with self.link.dedicated() as conn:
                    conn.execute(f"LISTEN {STATE_CHANNEL}")
                    changed("")
                    if failing:
                        log.info("store_listen_recovered", store=self.where)
                        failing = ""
                    while not stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_POLL_S):
                            changed(note.payload)
            except psycopg.Error as exc:
                if first_line(exc) != failing:
                    failing = first_line(exc)
                    log.warning("store_listen_failed", store=self.where, problem=failing)
                stop.wait(LISTEN_RETRY_S)

    # Replicas.

    @guarded
    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record, by id."""
        with self.link.connection() as conn:
            rows = conn.execute(f"SELECT {REPLICA_COLUMNS} FROM replicas ORDER BY id").fetchall()
        return [replica_of_row(self.where, row) for row in rows]

    @guarded
    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        """Insert or replace `puts` and forget `deletes` in one transaction."""
        if not puts and not deletes:
            return
        rows = [_replica_params(r) for r in puts]
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            if rows:
                with conn.cursor() as cur:
                    cur.executemany(_UPSERT_REPLICA, rows)
            if deletes:
                conn.execute("DELETE FROM replicas WHERE id = ANY(%s)", (list(deletes),))
            notify(conn)

    @guarded
    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert a replica record, or replace every field of the one with the same id."""
        params = _replica_params(record)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute(_UPSERT_REPLICA, params)
            notify(conn)

    @guarded
    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (deleting an unknown id does nothing)."""
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))
            notify(conn)

    # Rollouts.

    @guarded
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert a rollout, or replace its state (created_at is kept)."""
        spec = dump_json(record.spec)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute(
                "INSERT INTO rollouts (id, model, state, spec, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s::json, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                " state = excluded.state, spec = excluded.spec, updated_at = excluded.updated_at",
                (
                    record.id,
                    record.model,
                    record.state,
                    spec,
                    record.created_at,
                    record.updated_at,
                ),
            )
            notify(conn)

    @guarded
    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""
        with self.link.connection() as conn:
            row = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = %s", (rollout_id,)
            ).fetchone()
        return None if row is None else rollout_of_row(self.where, row)

    @guarded
    def list_rollouts(self, model: str = "", *, states: Sequence[str] = ()) -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first, only those in `states`
        when given; a row that does not decode is logged and left out (see
        SQLiteStore._readable)."""
        where, params = rollout_filter(model, states, "%s")
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY created_at DESC, id DESC",
                params,
            ).fetchall()
        return self._readable(rows, rollout_of_row)

    # Requests of rollouts.

    @guarded
    def put_rollout_request(self, request: RolloutRequest) -> None:
        """Record a request (a repeated id is ignored)."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute(
                "INSERT INTO rollout_requests"
                " (id, rollout_id, kind, reason, requested_by, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
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
        with self.link.connection() as conn:
            rows = conn.execute(
                "SELECT id, rollout_id, kind, reason, requested_by, created_at"
                " FROM rollout_requests ORDER BY created_at, id"
            ).fetchall()
        return [request_of_row(row) for row in rows]

    @guarded
    def delete_rollout_requests(self, ids: Sequence[str]) -> None:
        """Forget requests the controller carried out."""
        if not ids:
            return
        with self.link.connection() as conn, self._writing(conn):
            conn.execute("DELETE FROM rollout_requests WHERE id = ANY(%s)", (list(ids),))

    @once
    def append_event(self, rollout_id: str, at: float, event: dict[str, Any]) -> int:
        """Append an event; its seq is the rollout's last plus one, taken holding the rollout's
        row lock (an unknown rollout is refused by the foreign key)."""
        doc = dump_json(event)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute("SELECT 1 FROM rollouts WHERE id = %s FOR UPDATE", (rollout_id,))
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM rollout_events WHERE rollout_id = %s",
                (rollout_id,),
            ).fetchone()
            seq = (0 if row is None else int(row[0])) + 1
            conn.execute(
                "INSERT INTO rollout_events (rollout_id, seq, at, event)"
                " VALUES (%s, %s, %s, %s::json)",
                (rollout_id, seq, at, doc),
            )
            notify(conn)
        return seq

    @guarded
    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order (one that does not decode is logged
        and left out)."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM rollout_events"
                " WHERE rollout_id = %s AND seq > %s ORDER BY seq",
                (rollout_id, after_seq),
            ).fetchall()
        return self._readable(rows, event_of_row)


_STATE_DIGEST = (
    "SELECT (SELECT md5(coalesce(string_agg(concat_ws('|', "
    + REPLICA_COLUMNS.replace(", gpus,", ", gpus::text,").replace(", spec", ", spec::text")
    + "), ',' ORDER BY id), '')) FROM replicas),"
    " (SELECT md5(coalesce(string_agg(concat_ws('|', id, state, updated_at), ','"
    " ORDER BY id), '')) FROM rollouts)"
)


_UPSERT_REPLICA = (
    f"INSERT INTO replicas ({REPLICA_COLUMNS})"
    " VALUES (%s, %s, %s, %s, %s, %s::integer[], %s, %s, %s, %s, %s, %s::json, %s::json,"
    " %s::json)"
    " ON CONFLICT (id) DO UPDATE SET model = excluded.model, profile = excluded.profile,"
    " revision = excluded.revision, node = excluded.node, gpus = excluded.gpus,"
    " phase = excluded.phase, reason = excluded.reason, address = excluded.address,"
    " restarts = excluded.restarts, since = excluded.since, spec = excluded.spec,"
    " members = excluded.members, progress = excluded.progress"
)


def _replica_params(r: ReplicaRecord) -> tuple[Any, ...]:
    return (
        r.id,
        r.model,
        r.profile,
        r.revision,
        r.node,
        list(r.gpus),
        r.phase,
        r.reason,
        r.address,
        r.restarts,
        r.since,
        dump_json(r.spec),
        dump_json(list(r.members)),
        dump_json(r.progress),
    )


def notify(conn: BatchingConnection, payload: str = "") -> None:
    """Tell the fleets listening that replicas or rollouts changed (`payload` "") or desired
    sets did (base.DESIRED): PostgreSQL delivers it when the transaction commits, and not at all
    when it rolls back (one per transaction and payload however many are sent: identical
    notifications are folded). Nothing reads its answer, so in a batched transaction it goes
    with the COMMIT."""
    conn.write_later("SELECT pg_notify(%s, %s)", (STATE_CHANNEL, payload))
