"""Catalog.model_at: a model as one of its past revisions was, for an endpoint's context and
max output during a rollout (kept once read; nothing when the store cannot be read)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fleet_svc.catalog import Catalog
from fleet_svc.domain.catalog import Entry
from fleet_svc.store.base import ModelRecord, StoreUnavailable
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.model import Model

ENTRY = Entry(Model(name="m", source="hf://org/m", context_length=8192, max_output=1024))


def test_each_revision_as_it_was_and_none_for_one_never_written(tmp_path: Path) -> None:
    """Revision 1 keeps its context and max output after revision 2 changed them; an unknown
    revision or model is None."""
    store = SQLiteStore(tmp_path / "fleet.db")
    catalog = Catalog(store, lambda: 1.0)
    catalog.write(ENTRY, "t", 0)
    catalog.write(
        ENTRY.with_model(replace(ENTRY.model, context_length=16384, max_output=2048)), "t", 1
    )
    first, second = catalog.model_at("m", 1), catalog.model_at("m", 2)
    assert first is not None and (first.context_length, first.max_output) == (8192, 1024)
    assert second is not None and (second.context_length, second.max_output) == (16384, 2048)
    assert catalog.model_at("m", 3) is None and catalog.model_at("other", 1) is None
    store.close()


class FailingStore(SQLiteStore):
    """A SQLite store whose history reads fail as a store that cannot be reached does."""

    failing = False

    def model_history(self, name: str) -> list[ModelRecord]:
        if self.failing:
            raise StoreUnavailable(self.where, "connection refused")
        return super().model_history(name)


def test_a_revision_read_once_is_kept_and_an_unreadable_store_gives_none(tmp_path: Path) -> None:
    """Once read, a revision answers without the store; while the store cannot be read an
    unread one is None (nothing raises into the controller) and is read once it can."""
    store = FailingStore(tmp_path / "fleet.db")
    catalog = Catalog(store, lambda: 1.0)
    catalog.write(ENTRY, "t", 0)
    assert catalog.model_at("m", 1) is not None
    catalog.write(ENTRY, "t", 1)
    store.failing = True
    assert catalog.model_at("m", 1) is not None
    assert catalog.model_at("m", 2) is None
    store.failing = False
    assert catalog.model_at("m", 2) is not None
    store.close()
