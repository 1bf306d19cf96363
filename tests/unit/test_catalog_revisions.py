"""Catalog.model_at: a model as one of its past revisions was, for an endpoint's context and
max output during a rollout (kept once read; nothing when the store cannot be read)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fleet_svc.catalog import Catalog
from fleet_svc.domain.catalog import Entry
from fleet_svc.store.base import ModelRecord, StoreUnavailable
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.model import Model, Profile

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


class RacedStore(SQLiteStore):
    """A SQLite store where, once, another writer changes the catalog while the models are
    being listed (as the API's thread may while the controller's reads the wants); it counts
    history reads."""

    meanwhile: Catalog | None = None
    histories = 0

    def list_models(self) -> list[ModelRecord]:
        listed = super().list_models()
        catalog, self.meanwhile = self.meanwhile, None
        if catalog is not None:
            catalog.write(SERVED.with_model(replace(SERVED.model, max_output=7)), "t", 1)
        return listed

    def model_history(self, name: str) -> list[ModelRecord]:
        self.histories += 1
        return super().model_history(name)


SERVED = Entry(
    replace(ENTRY.model, profiles=(Profile(name="p", engine="vllm", gpu_class="L4", replicas=1),))
)


def test_wants_read_across_a_change_are_not_kept(tmp_path: Path) -> None:
    """Wants read while the catalog changed are answered but not kept, so the next ask reads
    the change; the revisions the wants were read at answer model_at without a history read."""
    store = RacedStore(tmp_path / "fleet.db")
    catalog = Catalog(store, lambda: 1.0)
    catalog.write(SERVED, "t", 0)
    store.meanwhile = catalog
    assert [w.revision for w in catalog.wants()] == [1]
    assert [w.revision for w in catalog.wants()] == [2]
    assert [w.revision for w in catalog.wants()] == [2]
    first, second = catalog.model_at("m", 1), catalog.model_at("m", 2)
    assert first is not None and first.max_output == 1024
    assert second is not None and second.max_output == 7
    assert store.histories == 0
    store.close()


class CountingStore(SQLiteStore):
    """A SQLite store that counts the catalog's listings."""

    listings = 0

    def list_models(self) -> list[ModelRecord]:
        self.listings += 1
        return super().list_models()


def test_a_transactions_revisions_reach_the_wants_once_committed_without_a_listing(
    tmp_path: Path,
) -> None:
    """Revisions written in a deferred block leave the kept wants as they were (the write may
    yet roll back); told committed, the wants hold them with no listing of the catalog, and a
    revision told after a later one of the same model changes nothing."""
    store = CountingStore(tmp_path / "fleet.db")
    catalog = Catalog(store, lambda: 1.0)
    catalog.write(SERVED, "t", 0)
    assert [w.revision for w in catalog.wants()] == [1] and store.listings == 1
    with catalog.deferred() as second:
        catalog.write(SERVED.with_model(replace(SERVED.model, max_output=7)), "t", 1)
    assert [w.revision for w in catalog.wants()] == [1]
    with catalog.deferred() as third:
        catalog.write(SERVED.with_model(replace(SERVED.model, max_output=8)), "t", 2)
    catalog.committed(third)
    catalog.committed(second)
    assert [w.revision for w in catalog.wants()] == [3] and store.listings == 1
    with catalog.deferred() as gone:
        catalog.write(SERVED, "t", 3, deleted=True)
    catalog.committed(gone)
    assert catalog.wants() == [] and store.listings == 1
    store.close()
