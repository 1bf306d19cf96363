"""Whether each stored row reads as the fleet reads it: the check a store runs when it opens.

A store decodes its rows' JSON itself; this module then maps each record through the same
functions the fleet uses (catalog_rows.revision_of, rows.replica_of, rows.load_rollout), so a
row that is valid JSON but not a model, replica or rollout (a profile that is a string, a phase
list that is a number) is found before the fleet serves, named by its table and key, instead of
failing every controller tick later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fleet_svc.store.base import (
    ModelRecord,
    ReplicaRecord,
    RolloutRecord,
    StoreDamaged,
)
from fleet_svc.store.catalog_rows import revision_of
from fleet_svc.store.rows import load_rollout, replica_of

R = TypeVar("R")


def problem_of(exc: BaseException) -> str:
    """What is wrong, in a few words, from the exception a decoder raised."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def decoded(where: str, table: str, key: str, decode: Callable[[], R]) -> R:
    """`decode()`, or StoreDamaged naming the row when it raises.

    Raises:
        StoreDamaged: the row does not decode.
    """
    try:
        return decode()
    except StoreDamaged:
        raise
    except Exception as exc:
        raise StoreDamaged(where, problem_of(exc), table=table, key=key) from exc


def model_key(name: str, revision: int) -> str:
    """A catalog row's key as messages name it."""
    return f"{name}@{revision}"


def check_model(where: str, record: ModelRecord) -> None:
    """A catalog row maps to a revision.

    Raises:
        StoreDamaged.
    """
    decoded(
        where,
        "model_revisions",
        model_key(record.name, record.revision),
        lambda: revision_of(record),
    )


def check_replica(where: str, record: ReplicaRecord) -> None:
    """A replica row maps to a replica.

    Raises:
        StoreDamaged.
    """
    decoded(where, "replicas", record.id, lambda: replica_of(record))


def check_rollout(where: str, record: RolloutRecord) -> None:
    """A rollout row maps to a rollout.

    Raises:
        StoreDamaged.
    """
    decoded(where, "rollouts", record.id, lambda: load_rollout(record))


def check_all(
    where: str,
    models: Iterable[ModelRecord],
    replicas: Iterable[ReplicaRecord],
    rollouts: Iterable[RolloutRecord],
) -> None:
    """Every record maps as the fleet maps it (the store decoded each row's JSON already).

    Raises:
        StoreDamaged: naming the first row that does not.
    """
    for model in models:
        check_model(where, model)
    for replica in replicas:
        check_replica(where, replica)
    for rollout in rollouts:
        check_rollout(where, rollout)


def json_object(value: Any) -> dict[str, Any]:
    """A decoded JSON value that must be an object (a spec, a state).

    Raises:
        TypeError: it is not.
    """
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, found {type(value).__name__}")
    return value
