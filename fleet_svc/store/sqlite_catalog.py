"""The SQLite store's catalog: model revisions, each change a row at the next revision, checked
and inserted under the write lock."""

from __future__ import annotations

from dataclasses import replace

from fleet_svc.store.base import ModelRecord, StaleRevision
from fleet_svc.store.codec import MODEL_COLUMNS, dump_json, model_of_row
from fleet_svc.store.migrations import immediate
from fleet_svc.store.sqlite_calls import SQLiteCalls, guarded


class CatalogCalls(SQLiteCalls):
    """The Store's calls on the catalog (base.Store), by the revision rules SQLiteStore's
    docstring gives."""

    @guarded
    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""
        row = self._conn.execute(
            f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = ?"
            " ORDER BY revision DESC LIMIT 1",
            (name,),
        ).fetchone()
        if row is None:
            return None
        record = model_of_row(self.where, row)
        return None if record.deleted else record

    @guarded
    def list_models(self) -> list[ModelRecord]:
        """Every current (latest, not deleted) model, by name."""
        rows = self._conn.execute(
            f"SELECT {MODEL_COLUMNS} FROM model_revisions AS m"
            " WHERE revision = (SELECT MAX(revision) FROM model_revisions WHERE name = m.name)"
            " AND deleted = 0 ORDER BY name"
        ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    @guarded
    def put_model(self, record: ModelRecord, *, expect_revision: int) -> ModelRecord:
        """Write `record` as the model's next revision if its latest one is `expect_revision`.

        The written revision is one past the model's last row, deletions included (see
        SQLiteStore's docstring). A model that never existed is at 0; a deleted one is at its
        deletion's revision, and 0 is accepted for it too. `record.revision` is ignored; every
        other field is stored as given.

        Args:
            record: the new state; `deleted=True` records a deletion.
            expect_revision: the revision the caller read (0 to create).

        Returns:
            `record` with the revision it was written as.

        Raises:
            StaleRevision: the model's latest revision is not `expect_revision` (`current` is the
                latest revision, a deletion's included; 0 when the model never existed).
            ValueError: a deletion of a model that is absent or deleted (nothing to delete).
        """
        spec = dump_json(record.spec)
        # Check and insert under one write lock: two writers holding the same etag cannot both
        # pass the check, the second sees the first's row and gets StaleRevision.
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT revision, deleted FROM model_revisions WHERE name = ?"
                " ORDER BY revision DESC LIMIT 1",
                (record.name,),
            ).fetchone()
            last = 0 if row is None else int(row[0])
            absent = row is None or bool(row[1])
            if expect_revision != last and not (absent and expect_revision == 0):
                raise StaleRevision(record.name, expect_revision, last)
            if record.deleted and absent:
                raise ValueError(f"model {record.name!r} does not exist, so it cannot be deleted")
            written = replace(record, revision=last + 1)
            self._conn.execute(
                f"INSERT INTO model_revisions ({MODEL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    written.name,
                    written.revision,
                    spec,
                    written.updated_by,
                    written.updated_at,
                    int(written.deleted),
                    written.declared_in,
                ),
            )
        return written

    @guarded
    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""
        rows = self._conn.execute(
            f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = ? ORDER BY revision",
            (name,),
        ).fetchall()
        return [model_of_row(self.where, row) for row in rows]
