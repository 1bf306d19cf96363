"""The PostgreSQL store's catalog: model revisions, each change a row at the next revision
that only a writer holding the last one inserts (see postgres.py on isolation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg

from fleet_svc.store.base import ModelRecord, RolloutRecord, StaleRevision
from fleet_svc.store.codec import (
    MODEL_COLUMNS,
    ROLLOUT_COLUMNS,
    dump_json,
    model_of_row,
    rollout_filter,
    rollout_of_row,
)
from fleet_svc.store.postgres_calls import PostgresCalls, guarded, once


class CatalogCalls(PostgresCalls):
    """The Store's calls on the catalog (base.Store)."""

    @guarded
    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""
        with self.link.connection() as conn:
            row = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s"
                " ORDER BY revision DESC LIMIT 1",
                (name,),
            ).fetchone()
        if row is None:
            return None
        record = model_of_row(self.where, row)
        return None if record.deleted else record

    @guarded
    def model_to_change(
        self, name: str, states: Sequence[str]
    ) -> tuple[ModelRecord | None, list[RolloutRecord]]:
        """The model's latest revision and its rollouts in `states` (Store.model_to_change), in
        one statement: a row per rollout, each beside the model's columns (one row, its
        rollout's columns empty, when there is none)."""
        where, params = rollout_filter(name, states, "%s")
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT m.*, r.* FROM (SELECT 1) AS one"
                f" LEFT JOIN (SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s"
                " ORDER BY revision DESC LIMIT 1) AS m ON true"
                f" LEFT JOIN (SELECT {ROLLOUT_COLUMNS} FROM rollouts{where}) AS r ON true"
                " ORDER BY r.created_at DESC, r.id DESC",
                [name, *params],
            ).fetchall()
        split = len(MODEL_COLUMNS.split(","))
        first = rows[0][:split]
        record = None if first[0] is None else model_of_row(self.where, first)
        rollouts = [row[split:] for row in rows if row[split] is not None]
        return (None if record is None or record.deleted else record), self._readable(
            rollouts, rollout_of_row
        )

    @guarded
    def list_models(self) -> list[ModelRecord]:
        """Every current (latest, not deleted) model, by name."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM (SELECT DISTINCT ON (name) {MODEL_COLUMNS}"
                " FROM model_revisions ORDER BY name, revision DESC) AS latest"
                " WHERE NOT deleted ORDER BY name"
            ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    @once
    def put_model(self, record: ModelRecord, *, expect_revision: int) -> ModelRecord:
        """Write `record` as the model's next revision if its latest one is `expect_revision`
        (the rules of SQLiteStore.put_model; the primary key settles a race, see the module
        docstring).

        Raises:
            StaleRevision: the model's latest revision is not `expect_revision`.
            ValueError: a deletion of a model that is absent or deleted.
        """
        params = {
            "name": record.name,
            "spec": dump_json(record.spec),
            "by": record.updated_by,
            "at": record.updated_at,
            "deleted": record.deleted,
            "declared_in": record.declared_in,
            "expect": expect_revision,
        }
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            if conn.deferring and expect_revision > 0:
                # Checked at the block's commit: written, the revision is the one after
                # `expect_revision` (the compare-and-swap's only outcome for an existing
                # revision); not written, the block raises ChecksFailed.
                conn.check_later(_PUT_MODEL_CHECKED, params)
                return replace(record, revision=expect_revision + 1)
            # One statement in the common case: the revision after the last, inserted only
            # when the last is the one expected; a writer that read the same last revision
            # and inserted first wins (this insert waits for its commit, then does nothing:
            # no error, so an atomic block needs no savepoint around it).
            row = conn.execute(_PUT_MODEL, params).fetchone()
            if row is not None:
                return replace(record, revision=int(row[0]))
            last, absent = _latest(conn, record.name)
            if record.deleted and absent and expect_revision in (0, last):
                raise ValueError(f"model {record.name!r} does not exist, so it cannot be deleted")
            raise StaleRevision(record.name, expect_revision, last)

    @guarded
    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s ORDER BY revision",
                (name,),
            ).fetchall()
        return [model_of_row(self.where, row) for row in rows]


_LAST = """last AS (
    SELECT revision, deleted FROM model_revisions WHERE name = %(name)s
    ORDER BY revision DESC LIMIT 1
)"""
_INSERT_NEXT = f"""INSERT INTO model_revisions ({MODEL_COLUMNS})
SELECT %(name)s, COALESCE((SELECT revision FROM last), 0) + 1, %(spec)s::json, %(by)s, %(at)s,
       %(deleted)s, %(declared_in)s
WHERE (COALESCE((SELECT revision FROM last), 0) = %(expect)s
       OR (%(expect)s = 0 AND COALESCE((SELECT deleted FROM last), true)))
  AND NOT (%(deleted)s AND COALESCE((SELECT deleted FROM last), true))
ON CONFLICT (name, revision) DO NOTHING
RETURNING revision"""
_PUT_MODEL = f"WITH {_LAST}\n{_INSERT_NEXT}"
"""A model's next revision, written only when its last one is %(expect)s (or it is absent and
%(expect)s is 0), and never a deletion of a model that is absent: see CatalogCalls.put_model."""
_PUT_MODEL_CHECKED = f"WITH {_LAST},\nchecked AS ({_INSERT_NEXT})\nSELECT 1 / count(*) FROM checked"
"""_PUT_MODEL as a check the server makes (postgres_batch.CHECKED: a data-modifying WITH query
must be at the top, so the form is spelled out here): division_by_zero when nothing was
written."""


def _latest(conn: psycopg.Connection[tuple[Any, ...]], name: str) -> tuple[int, bool]:
    """A model's last revision (0 when it never existed) and whether it is absent now."""
    row = conn.execute(
        "SELECT revision, deleted FROM model_revisions WHERE name = %s"
        " ORDER BY revision DESC LIMIT 1",
        (name,),
    ).fetchone()
    return (0, True) if row is None else (int(row[0]), bool(row[1]))
