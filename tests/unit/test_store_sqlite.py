"""What only the SQLite store has: its file and pragmas, its migrations in user_version, its
same-thread rule, the URLs naming a file, and a damaged file found when it opens (the store
suite both stores pass is tests/integration/test_store.py)."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from fleet_svc.store.base import ReplicaRecord, StoreDamaged, StoreUnavailable
from fleet_svc.store.migrations import (
    MIGRATIONS,
    Migration,
    MigrationOrderError,
    SchemaTooNew,
    latest_version,
    migrate,
    schema_version,
)
from fleet_svc.store.sqlite import SQLiteStore
from fleet_svc.store.urls import open_store
from tests.support.store_records import garble_an_index_page, model


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A fresh store in a temporary folder, closed after the test."""
    with SQLiteStore(tmp_path / "fleet.db", clock=lambda: 1_764_000_123.5) as opened:
        yield opened


# Threads ----------------------------------------------------------------------------------------


def test_a_store_refuses_calls_from_another_thread(store: SQLiteStore) -> None:
    """A call from a thread other than the opener's raises instead of racing."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            store.get_value("k")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert isinstance(errors[0], sqlite3.ProgrammingError)


# Opening and migrations -------------------------------------------------------------------------


def test_open_creates_folders_and_sets_durable_pragmas(tmp_path: Path) -> None:
    """Opening makes missing parent folders and a WAL, synchronous=FULL, foreign-keyed database."""
    path = tmp_path / "data" / "fleet" / "fleet.db"
    with SQLiteStore(path) as store:
        conn = store._conn
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # 2 is FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    assert path.is_file()


def test_migrations_apply_on_a_fresh_file_and_reopen_is_idempotent(tmp_path: Path) -> None:
    """A fresh file gets the latest schema; reopening applies nothing and keeps the data."""
    path = tmp_path / "fleet.db"
    with SQLiteStore(path) as store:
        store.put_model(model(), expect_revision=0)
    with closing(sqlite3.connect(path, isolation_level=None)) as raw:
        assert schema_version(raw) == latest_version()
        tables = {
            row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert {"model_revisions", "answers", "replicas", "named_values"} <= tables
        assert migrate(raw, str(path)) == []
    with SQLiteStore(path) as store:
        assert [m.revision for m in store.list_models()] == [1]


def test_a_database_from_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    """A file whose schema is newer than the code's is refused with both versions, unchanged."""
    path = tmp_path / "fleet.db"
    future = latest_version() + 1
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {future}")
    raw.close()
    with pytest.raises(SchemaTooNew) as refused:
        SQLiteStore(path)
    assert (refused.value.found_version, refused.value.known_version) == (future, latest_version())
    assert str(path) in str(refused.value)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone() == (future,)
    assert raw.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    raw.close()


STEP_1 = Migration(1, "a table", ("CREATE TABLE t (a INTEGER)",))
STEP_2 = Migration(2, "a column", ("ALTER TABLE t ADD COLUMN b TEXT NOT NULL DEFAULT 'x'",))


def test_an_older_database_is_migrated_forward(tmp_path: Path) -> None:
    """A database at version 1 gets only the later migrations, and keeps its rows."""
    raw = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    assert migrate(raw, "old.db", [STEP_1]) == [1]
    raw.execute("INSERT INTO t (a) VALUES (7)")
    assert migrate(raw, "old.db", [STEP_1, STEP_2]) == [2]
    assert schema_version(raw) == 2
    assert raw.execute("SELECT a, b FROM t").fetchall() == [(7, "x")]
    raw.close()


def test_a_failing_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    """A migration that fails part-way is rolled back whole: no table, no version bump."""
    broken = Migration(2, "broken", ("CREATE TABLE u (a INTEGER)", "THIS IS NOT SQL"))
    raw = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    migrate(raw, "old.db", [STEP_1])
    with pytest.raises(sqlite3.OperationalError):
        migrate(raw, "old.db", [STEP_1, broken])
    assert schema_version(raw) == 1
    assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'u'").fetchall() == []
    raw.close()


@pytest.mark.parametrize(
    "migrations", [[STEP_2], [STEP_1, STEP_1], [STEP_2, STEP_1]], ids=["gap", "dup", "order"]
)
def test_misnumbered_migrations_are_refused(tmp_path: Path, migrations: list[Migration]) -> None:
    """Migrations not numbered 1..N in order are refused before anything is applied."""
    raw = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    with pytest.raises(MigrationOrderError):
        migrate(raw, "x.db", migrations)
    assert schema_version(raw) == 0
    raw.close()


def test_shipped_migrations_are_numbered_in_order() -> None:
    """The schema's own migrations run 1, 2, 3 … so every database converges on one schema."""
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


# open_store -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "relative_path"),
    [
        # {tmp} is absolute (it starts with "/"), so this is sqlite:///tmp/…/abs/fleet.db.
        ("sqlite://{tmp}/abs/fleet.db", "abs/fleet.db"),
        ("sqlite://rel/fleet.db", "rel/fleet.db"),
        ("{tmp}/plain/fleet.db", "plain/fleet.db"),
        ("plain-rel.db", "plain-rel.db"),
    ],
    ids=["absolute-url", "relative-url", "absolute-path", "relative-path"],
)
def test_open_store_accepts_sqlite_urls_and_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, relative_path: str
) -> None:
    """SQLite URLs (absolute and relative) and plain paths open the named file."""
    monkeypatch.chdir(tmp_path)
    store = open_store(url.format(tmp=tmp_path))
    try:
        store.put_value("k", "v")
    finally:
        store.close()
    assert (tmp_path / relative_path).is_file()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://fleet@db/fleet", "unknown store URL scheme 'mysql'"),
        ("sqlite://", "names no file"),
        ("", "names no file"),
    ],
)
def test_open_store_refuses_what_it_cannot_open(url: str, message: str) -> None:
    """URLs naming another database or no file are refused with a message saying what works."""
    with pytest.raises(ValueError, match=message):
        open_store(url)


# A damaged file ---------------------------------------------------------------------------------

PAGE_BYTES = 4096
"""SQLite's default page size (https://www.sqlite.org/pragma.html#pragma_page_size)."""


def _filled(path: Path, models: int = 70) -> int:
    """A closed store file holding `models` models with long specs (many pages); its pages."""
    with SQLiteStore(path) as store:
        for i in range(models):
            spec = {"name": f"m{i}", "source": "hf://org/" + "x" * 400, "profiles": []}
            store.put_model(model(f"m{i}", spec=spec), expect_revision=0)
            store.put_replica(ReplicaRecord(id=f"r-{i}", model=f"m{i}", profile="p", revision=1))
    # Closing the last connection checkpoints the WAL into the file and removes the log.
    assert not path.with_name(path.name + "-wal").exists()
    return path.stat().st_size // PAGE_BYTES


def test_a_garbage_page_is_found_when_the_store_opens(tmp_path: Path) -> None:
    """A page of garbage in the middle of the file is refused at open as damage naming the
    file, rather than opening and failing every later read that touches the page."""
    path = tmp_path / "fleet.db"
    assert _filled(path) > 8
    garble_an_index_page(path, PAGE_BYTES)
    with pytest.raises(StoreDamaged) as refused:
        open_store(str(path))
    message = str(refused.value)
    assert message.startswith(f"the fleet store {path}: PRAGMA quick_check found damage: ")
    assert "\n" not in message and "***" not in message


@pytest.mark.parametrize(
    "damage",
    ["truncated", "text", "zeroed-header", "empty"],
)
def test_a_file_that_is_not_a_whole_database_is_refused_naming_it(
    tmp_path: Path, damage: str
) -> None:
    """A truncated file, a text file and a file whose header is gone are each refused as damage
    naming the file, never a raw sqlite3 error."""
    path = tmp_path / "fleet.db"
    pages = _filled(path)
    if damage == "truncated":
        os.truncate(path, (pages // 3) * PAGE_BYTES + 100)
    elif damage == "empty":
        os.truncate(path, 0)
    elif damage == "text":
        path.write_text("model_revisions: llama\n" * 500)
    else:
        with path.open("r+b") as f:
            f.write(b"\0" * 100)
    with pytest.raises(StoreDamaged) as refused:
        open_store(str(path))
    assert str(path) in str(refused.value)


def test_a_row_whose_json_is_cut_short_is_refused_naming_it(tmp_path: Path) -> None:
    """A catalog row whose spec is not JSON at all (SQLite keeps text; PostgreSQL's json type
    would refuse it) is refused at open naming its key."""
    path = tmp_path / "fleet.db"
    _filled(path, models=3)
    with closing(sqlite3.connect(path)) as raw, raw:
        raw.execute('UPDATE model_revisions SET spec = \'{"name": "m1", "pro\' WHERE name = \'m1\'')
    with pytest.raises(StoreDamaged) as refused:
        open_store(str(path))
    assert (refused.value.table, refused.value.key) == ("model_revisions", "m1@1")
    assert "JSONDecodeError" in str(refused.value)


def test_a_path_that_cannot_be_opened_is_unavailable_not_damaged(tmp_path: Path) -> None:
    """A folder where the file should be is a store that cannot be opened (no damage to report),
    named in the message."""
    (tmp_path / "fleet.db").mkdir()
    with pytest.raises(StoreUnavailable) as refused:
        open_store(str(tmp_path / "fleet.db"))
    assert str(tmp_path / "fleet.db") in str(refused.value)


def test_answers_of_a_version_2_file_read_back_without_a_fingerprint(tmp_path: Path) -> None:
    """A file an older fleet wrote (schema 2) opens migrated: its answers read back with an
    empty fingerprint (matched by method alone), and new ones keep theirs."""
    path = tmp_path / "fleet.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as raw:
        migrate(raw, str(path), MIGRATIONS[:2])
        raw.execute(
            "INSERT INTO answers (request_id, method, answer, created_at) VALUES (?, ?, ?, ?)",
            ("req-old", "SetGPUs", b"old", 1.0),
        )
    with SQLiteStore(path) as store:
        old = store.get_answer("req-old")
        assert old is not None and (old.method, old.answer, old.fingerprint) == (
            "SetGPUs",
            b"old",
            "",
        )
        store.put_answer("req-new", "SetGPUs", b"new", fingerprint="fp")
        new = store.get_answer("req-new")
        assert new is not None and new.fingerprint == "fp"


def test_a_batch_of_replicas_sharing_a_spec_is_written_and_read_back_each(
    tmp_path: Path,
) -> None:
    """write_replicas with many replicas of one spec (one dict dumped once) and a delete
    stores each replica with its own fields, the shared spec, and not the one deleted."""
    from fleet_svc.domain.phases import ReplicaPhase
    from fleet_svc.domain.replicas import ReplicaState, RunSpec
    from fleet_svc.store.rows import replica_of, replica_record

    store = SQLiteStore(tmp_path / "fleet.db")
    spec = RunSpec("vllm", ("--max-model-len", "8192"), source="hf://org/m")
    replicas = [
        ReplicaState(
            id=f"r{i:02d}",
            model="m",
            profile="p",
            revision=1,
            spec=spec,
            phase=ReplicaPhase.STARTING,
            node=f"n{i}",
            gpus=(i % 2,),
        )
        for i in range(12)
    ]
    store.write_replicas([replica_record(r) for r in replicas], [])
    store.write_replicas([], ["r00"])
    back = [replica_of(rec) for rec in store.list_replicas()]
    assert back == replicas[1:]
    store.close()
