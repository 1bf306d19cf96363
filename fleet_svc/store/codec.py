"""Rows to records and back, for both stores: JSON written one way, every row read back checked.

SQLite hands back JSON columns as text, PostgreSQL (jsonb, int[]) as Python values; each reader
here takes either. A row that does not decode raises StoreDamaged naming its table and key, never
the decoder's own exception, so the fleet can tell a damaged row from a bug.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog

from fleet_svc.store.base import (
    EventRecord,
    ModelRecord,
    ReplicaRecord,
    RolloutRecord,
    RolloutRequest,
    StoreDamaged,
    TrafficRecord,
)
from fleet_svc.store.verify import decoded, json_object, model_key

log = structlog.get_logger(__name__)

MODEL_COLUMNS = "name, revision, spec, updated_by, updated_at, deleted, declared_in"
REPLICA_COLUMNS = (
    "id, model, profile, revision, node, gpus, phase, reason, address, restarts, since, spec,"
    " members, progress"
)
ROLLOUT_COLUMNS = "id, model, state, spec, created_at, updated_at"
EVENT_COLUMNS = "rollout_id, seq, at, event"
TRAFFIC_COLUMNS = (
    "gateway, interval_start_ms, replica_id, model, revision, interval_s, figures, received_at"
)


def rollout_filter(model: str, states: Sequence[str], mark: str) -> tuple[str, list[Any]]:
    """The WHERE clause (with its parameters, `mark` being the driver's placeholder) of a
    listing of rollouts of `model` ("" for every model) in `states` (empty for any)."""
    clauses, params = [], []
    if model:
        clauses.append(f"model = {mark}")
        params.append(model)
    if states:
        clauses.append(f"state IN ({', '.join([mark] * len(states))})")
        params.extend(states)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def request_of_row(row: tuple[Any, ...]) -> RolloutRequest:
    """A rollout request row as a record (its columns are plain text and a number)."""
    return RolloutRequest(
        id=str(row[0]),
        rollout_id=str(row[1]),
        kind=str(row[2]),
        reason=str(row[3]),
        by=str(row[4]),
        created_at=float(row[5]),
    )


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)
"""One encoder for every dump: `json.dumps` with options builds one a call (about a third of
a small value's time; a flush of 1,000 replicas dumps 4,000 values). It keeps no state
between calls, so threads may share it."""


def dump_json(value: Any) -> str:
    """Compact, key-sorted JSON; NaN and unknown types refused (ValueError, TypeError), since a
    value that cannot be read back must fail when written, not when read."""
    if not value and type(value) in (list, dict):
        return "[]" if type(value) is list else "{}"  # a replica's members and progress, mostly
    return _ENCODER.encode(value)


def _loaded(value: Any) -> Any:
    """A JSON column's value: text is parsed (SQLite), anything else is already decoded."""
    if isinstance(value, str | bytes | bytearray):
        return json.loads(value)
    return value


def loaded_heard(value: Any) -> dict[str, float]:
    """A holder's beat's JSON column (node -> heard_at); entries that are not a name and a
    number are left out, and a column that is no object reads as empty (logged)."""
    return {
        node: float(at)
        for node, at in loaded_object(value).items()
        if isinstance(at, int | float) and not isinstance(at, bool)
    }


def loaded_object(value: Any) -> dict[str, Any]:
    """A JSON column holding an object (a node's report); {} for one that does not decode to
    an object (logged), so one bad row costs its node's report, not the reader's tick."""
    try:
        doc = _loaded(value)
    except ValueError as exc:
        log.warning("store_row_unreadable", problem=str(exc)[:200])
        return {}
    if not isinstance(doc, dict):
        log.warning("store_row_unreadable", problem="not a JSON object")
        return {}
    return doc


def model_of_row(where: str, row: tuple[Any, ...]) -> ModelRecord:
    """A catalog row as a record.

    Raises:
        StoreDamaged.
    """
    name, revision, spec, updated_by, updated_at, deleted, declared_in = row
    return decoded(
        where,
        "model_revisions",
        model_key(str(name), revision),
        lambda: ModelRecord(
            name=str(name),
            revision=int(revision),
            spec=json_object(_loaded(spec)),
            updated_by=str(updated_by),
            updated_at=float(updated_at),
            deleted=bool(deleted),
            declared_in=str(declared_in),
        ),
    )


def replica_of_row(where: str, row: tuple[Any, ...]) -> ReplicaRecord:
    """A replica row as a record.

    Raises:
        StoreDamaged.
    """
    (id_, model, profile, revision, node, gpus, phase, reason, address, restarts, since, spec) = (
        row[:12]
    )
    members = row[12] if len(row) > 12 else "[]"
    progress = row[13] if len(row) > 13 else "{}"
    return decoded(
        where,
        "replicas",
        str(id_),
        lambda: ReplicaRecord(
            id=str(id_),
            model=str(model),
            profile=str(profile),
            revision=int(revision),
            node=str(node),
            gpus=tuple(int(g) for g in _loaded(gpus)),
            phase=str(phase),
            reason=str(reason),
            address=str(address),
            restarts=int(restarts),
            since=float(since),
            spec=json_object(_loaded(spec)),
            members=tuple(json_object(m) for m in _loaded(members)),
            progress=json_object(_loaded(progress)),
        ),
    )


def rollout_of_row(where: str, row: tuple[Any, ...]) -> RolloutRecord:
    """A rollout row as a record.

    Raises:
        StoreDamaged.
    """
    id_, model, state, spec, created_at, updated_at = row
    return decoded(
        where,
        "rollouts",
        str(id_),
        lambda: RolloutRecord(
            id=str(id_),
            model=str(model),
            state=str(state),
            spec=json_object(_loaded(spec)),
            created_at=float(created_at),
            updated_at=float(updated_at),
        ),
    )


def event_of_row(where: str, row: tuple[Any, ...]) -> EventRecord:
    """An event row as a record.

    Raises:
        StoreDamaged.
    """
    rollout_id, seq, at, event = row
    return decoded(
        where,
        "rollout_events",
        f"{rollout_id}#{seq}",
        lambda: EventRecord(str(rollout_id), int(seq), float(at), json_object(_loaded(event))),
    )


def traffic_of_row(where: str, row: tuple[Any, ...]) -> TrafficRecord:
    """A traffic report row as a record.

    Raises:
        StoreDamaged.
    """
    gateway, start, replica_id, model, revision, interval_s, figures, received_at = row
    return decoded(
        where,
        "traffic_reports",
        f"{gateway}@{start}/{replica_id}",
        lambda: TrafficRecord(
            gateway=str(gateway),
            interval_start_ms=int(start),
            replica_id=str(replica_id),
            model=str(model),
            revision=int(revision),
            interval_s=int(interval_s),
            figures=json_object(_loaded(figures)),
            received_at=float(received_at),
        ),
    )


def traffic_row(record: TrafficRecord) -> tuple[Any, ...]:
    """A traffic record as the row both stores write (figures as JSON text)."""
    return (
        record.gateway,
        record.interval_start_ms,
        record.replica_id,
        record.model,
        record.revision,
        record.interval_s,
        dump_json(record.figures),
        record.received_at,
    )


R = TypeVar("R")


def readable_rows(
    where: str, rows: Sequence[tuple[Any, ...]], decode: Callable[[str, tuple[Any, ...]], R]
) -> tuple[list[R], StoreDamaged | None]:
    """The rows of a listing that decode, and the first damage met. A row that does not is
    logged with its key and left out; the store remembers the damage (so health turns
    NOT_SERVING). Only listings people read (rollouts, their events) skip: a catalog or replica
    row the controller acts on is never skipped, since acting on part of the catalog would stop
    the replicas of the model left out."""
    out: list[R] = []
    damage: StoreDamaged | None = None
    for row in rows:
        try:
            out.append(decode(where, row))
        except StoreDamaged as exc:
            damage = damage or exc
            log.error(
                "store_row_skipped", store=where, table=exc.table, key=exc.key, problem=exc.problem
            )
    return out, damage
