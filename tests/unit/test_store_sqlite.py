"""The SQLite store: revisions and etags, answers, replicas, values, migrations, racing writers."""

from __future__ import annotations

import inspect
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet_svc.store.base import ModelRecord, ReplicaRecord, StaleRevision, Store
from fleet_svc.store.migrations import (
    MIGRATIONS,
    Migration,
    MigrationOrderError,
    SchemaTooNew,
    latest_version,
    migrate,
    schema_version,
)
from fleet_svc.store.sqlite import SQLiteStore, open_store

# A catalog model as the fleet stores it: the llmgw.common.v1.Model JSON form, proto field names
# (int64 fields as strings, as protobuf's JSON mapping writes them).
LLAMA_SPEC: dict[str, Any] = {
    "name": "llama-3.1-8b",
    "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
    "context_length": "131072",
    "max_output": "8192",
    "profiles": [
        {
            "name": "h100",
            "engine": "vllm",
            "args": ["--max-model-len", "131072", "--gpu-memory-utilization", "0.9"],
            "gpu_class": "H100-80GB",
            "gpus_per_node": 1,
            "tp": 1,
            "replicas": 2,
        }
    ],
}
QWEN_SPEC: dict[str, Any] = {
    "name": "qwen2.5-0.5b",
    "source": "http://127.0.0.1:8000/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_only": True, "min_memory_gb": 2}],
}


def model(
    name: str = "llama-3.1-8b",
    *,
    deleted: bool = False,
    spec: dict[str, Any] | None = None,
    updated_by: str = "alice@example.com",
    updated_at: float = 1_764_000_000.25,
    declared_in: str = "",
) -> ModelRecord:
    """A model record to write; the store assigns the revision."""
    return ModelRecord(
        name=name,
        revision=0,
        spec=LLAMA_SPEC if spec is None else spec,
        updated_by=updated_by,
        updated_at=updated_at,
        deleted=deleted,
        declared_in=declared_in,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """A fresh store in a temporary folder, closed after the test."""
    with SQLiteStore(tmp_path / "fleet.db", clock=lambda: 1_764_000_123.5) as opened:
        yield opened


# Catalog revisions ------------------------------------------------------------------------------

# Each step: (deleted, expect_revision, outcome); outcome is the revision written, or
# ("stale", current) for a refusal naming the model's current revision.
Step = tuple[bool, int, "int | tuple[str, int]"]

REVISION_CASES: list[tuple[str, list[Step]]] = [
    ("create then update twice counts up", [(False, 0, 1), (False, 1, 2), (False, 2, 3)]),
    ("creating an existing model is stale", [(False, 0, 1), (False, 0, ("stale", 1))]),
    ("updating an absent model is stale", [(False, 1, ("stale", 0))]),
    ("an etag one behind is stale", [(False, 0, 1), (False, 1, 2), (False, 1, ("stale", 2))]),
    ("an etag ahead is stale", [(False, 0, 1), (False, 5, ("stale", 1))]),
    ("a deletion is a revision", [(False, 0, 1), (True, 1, 2)]),
    (
        "creating after a deletion on etag 0 continues the count",
        [(False, 0, 1), (False, 1, 2), (True, 2, 3), (False, 0, 4), (False, 4, 5)],
    ),
    (
        "creating after a deletion on the deletion's etag continues the count",
        [(False, 0, 1), (True, 1, 2), (False, 2, 3)],
    ),
    (
        "writing on an etag from before the deletion is stale",
        [(False, 0, 1), (True, 1, 2), (False, 1, ("stale", 2))],
    ),
    (
        "creating twice after a deletion is stale",
        [(False, 0, 1), (True, 1, 2), (False, 0, 3), (False, 0, ("stale", 3))],
    ),
]


@pytest.mark.parametrize(
    "steps", [steps for _, steps in REVISION_CASES], ids=[name for name, _ in REVISION_CASES]
)
def test_put_model_revisions(store: SQLiteStore, steps: list[Step]) -> None:
    """Each write lands at one past the last row or is refused naming the current revision."""
    written = 0
    for deleted, expect, outcome in steps:
        record = model(deleted=deleted, updated_by=f"step-{written}")
        if isinstance(outcome, tuple):
            with pytest.raises(StaleRevision) as refused:
                store.put_model(record, expect_revision=expect)
            assert (refused.value.name, refused.value.expected, refused.value.current) == (
                record.name,
                expect,
                outcome[1],
            )
        else:
            assert store.put_model(record, expect_revision=expect).revision == outcome
            written += 1
    history = store.model_history("llama-3.1-8b")
    assert [r.revision for r in history] == list(range(1, written + 1))
    assert [r.updated_by for r in history] == [f"step-{i}" for i in range(written)]


def test_model_fields_round_trip(store: SQLiteStore) -> None:
    """Every field of a written model reads back equal, with the revision the store gave it."""
    record = model(
        spec=QWEN_SPEC, updated_by="ops@example.com", declared_in="/etc/llmgw/cluster.yaml"
    )
    record = replace(record, name="qwen2.5-0.5b", revision=42)
    written = store.put_model(record, expect_revision=0)
    assert written == replace(record, revision=1)
    assert store.get_model("qwen2.5-0.5b") == written
    assert store.model_history("qwen2.5-0.5b") == [written]
    assert store.list_models() == [written]


def test_deleted_model_leaves_get_and_list_but_stays_in_history(store: SQLiteStore) -> None:
    """A deleted model reads as absent and is not listed, while history keeps every revision."""
    store.put_model(model(), expect_revision=0)
    store.put_model(model("qwen2.5-0.5b", spec=QWEN_SPEC), expect_revision=0)
    store.put_model(model(updated_by="bob@example.com"), expect_revision=1)
    store.put_model(model(deleted=True, updated_by="carol@example.com"), expect_revision=2)
    assert store.get_model("llama-3.1-8b") is None
    assert [m.name for m in store.list_models()] == ["qwen2.5-0.5b"]
    history = store.model_history("llama-3.1-8b")
    assert [(r.revision, r.updated_by, r.deleted) for r in history] == [
        (1, "alice@example.com", False),
        (2, "bob@example.com", False),
        (3, "carol@example.com", True),
    ]


def test_list_models_gives_each_latest_revision_by_name(store: SQLiteStore) -> None:
    """The listing holds one record per current model, its latest revision, sorted by name."""
    for name in ("zeta", "alpha", "mid"):
        store.put_model(model(name, updated_by="v1"), expect_revision=0)
    store.put_model(model("mid", updated_by="v2"), expect_revision=1)
    listed = store.list_models()
    assert [(m.name, m.revision, m.updated_by) for m in listed] == [
        ("alpha", 1, "v1"),
        ("mid", 2, "v2"),
        ("zeta", 1, "v1"),
    ]


def test_unknown_model_reads_as_absent(store: SQLiteStore) -> None:
    """A name never written has no current record and an empty history."""
    assert store.get_model("nope") is None
    assert store.model_history("nope") == []
    assert store.list_models() == []


@pytest.mark.parametrize(
    ("deleted_before", "expect"),
    [(False, 0), (True, 0), (True, 2)],
    ids=["never-existed", "deleted-etag-0", "deleted-etag-of-deletion"],
)
def test_deleting_an_absent_model_is_refused(
    store: SQLiteStore, deleted_before: bool, expect: int
) -> None:
    """A deletion of a model that never existed or is already deleted is refused, writing no row."""
    if deleted_before:
        store.put_model(model(), expect_revision=0)
        store.put_model(model(deleted=True), expect_revision=1)
    rows_before = len(store.model_history("llama-3.1-8b"))
    with pytest.raises(ValueError, match="does not exist"):
        store.put_model(model(deleted=True), expect_revision=expect)
    assert len(store.model_history("llama-3.1-8b")) == rows_before


@pytest.mark.parametrize(
    ("spec", "error"),
    [({"context_length": float("nan")}, ValueError), ({"when": object()}, TypeError)],
    ids=["nan", "object"],
)
def test_spec_that_is_not_json_is_refused(
    store: SQLiteStore, spec: dict[str, Any], error: type[Exception]
) -> None:
    """A spec that could not be read back as JSON is refused at write, and nothing is stored."""
    with pytest.raises(error):
        store.put_model(model(spec=spec), expect_revision=0)
    assert store.model_history("llama-3.1-8b") == []


# Racing writers ---------------------------------------------------------------------------------


def test_racing_writers_with_one_etag_yield_exactly_one_winner(tmp_path: Path) -> None:
    """Two stores on one file in two threads, writing on the same etag at once: one wins."""
    path = tmp_path / "fleet.db"
    SQLiteStore(path).close()
    rounds = 25
    barrier = threading.Barrier(2)
    outcomes: dict[str, list[int | StaleRevision]] = {"a": [], "b": []}
    failures: list[BaseException] = []

    def writer(who: str) -> None:
        try:
            with SQLiteStore(path) as mine:
                for expect in range(rounds):
                    barrier.wait(timeout=10)
                    try:
                        written = mine.put_model(model(updated_by=who), expect_revision=expect)
                        outcomes[who].append(written.revision)
                    except StaleRevision as stale:
                        outcomes[who].append(stale)
                    # Both writers see the round's winner before the next round starts.
                    barrier.wait(timeout=10)
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    with SQLiteStore(path) as reader:
        history = reader.model_history("llama-3.1-8b")
    assert [r.revision for r in history] == list(range(1, rounds + 1))
    for n, (a, b) in enumerate(zip(outcomes["a"], outcomes["b"], strict=True)):
        won = [x for x in (a, b) if isinstance(x, int)]
        lost = [x for x in (a, b) if isinstance(x, StaleRevision)]
        assert won == [n + 1], f"round {n}: {a!r} / {b!r}"
        assert [(s.expected, s.current) for s in lost] == [(n, n + 1)]
        assert history[n].updated_by == ("a" if isinstance(a, int) else "b")


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


# Answers, replicas, values ----------------------------------------------------------------------


def test_first_answer_to_a_request_wins(store: SQLiteStore) -> None:
    """A second answer to the same request id is ignored; other ids are separate."""
    assert store.get_answer("req-1") is None
    store.put_answer("req-1", "CreateModel", b"\x08\x01first")
    store.put_answer("req-1", "DeleteModel", b"second")
    store.put_answer("req-2", "UpdateModel", b"")
    assert store.get_answer("req-1") == ("CreateModel", b"\x08\x01first")
    assert store.get_answer("req-2") == ("UpdateModel", b"")


def test_answers_are_stamped_with_the_injected_clock(store: SQLiteStore, tmp_path: Path) -> None:
    """An answer's creation time is the store's clock at the first write."""
    store.put_answer("req-1", "CreateModel", b"x")
    with closing(sqlite3.connect(tmp_path / "fleet.db")) as raw:
        (created_at,) = raw.execute("SELECT created_at FROM answers").fetchone()
    assert created_at == 1_764_000_123.5


REPLICAS = [
    ReplicaRecord(id="r-min", model="qwen2.5-0.5b", profile="cpu", revision=1),
    ReplicaRecord(
        id="llama-3.1-8b/h100/0",
        model="llama-3.1-8b",
        profile="h100",
        revision=7,
        node="gpu-node-3",
        gpus=(4, 5, 6, 7),
        phase="READY",
        reason="engine healthy",
        address="10.0.3.17:8001",
        restarts=3,
        since=1_764_000_456.125,
        spec={
            "engine": "vllm",
            "args": ["--tensor-parallel-size", "4"],
            "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "gpus": [4, 5, 6, 7],
        },
    ),
]


@pytest.mark.parametrize("record", REPLICAS, ids=[r.id for r in REPLICAS])
def test_replica_insert_replace_delete(store: SQLiteStore, record: ReplicaRecord) -> None:
    """Every replica field reads back equal after insert and after replace; delete forgets it."""
    store.put_replica(record)
    assert store.list_replicas() == [record]
    changed = replace(
        record,
        revision=record.revision + 1,
        node="gpu-node-9",
        gpus=(0,),
        phase="STOPPING",
        reason="drained: model updated",
        address="",
        restarts=record.restarts + 1,
        since=record.since + 60.5,
        spec={"engine": "sglang"},
    )
    store.put_replica(changed)
    assert store.list_replicas() == [changed]
    store.delete_replica(record.id)
    assert store.list_replicas() == []
    store.delete_replica(record.id)


def test_replicas_are_listed_by_id(store: SQLiteStore) -> None:
    """Several replicas are all listed, in id order, whatever order they were written in."""
    for record in reversed(REPLICAS):
        store.put_replica(record)
    assert store.list_replicas() == sorted(REPLICAS, key=lambda r: r.id)


def test_values_store_replace_and_default_to_none(store: SQLiteStore) -> None:
    """A value reads back as last written; a key never set reads as None."""
    assert store.get_value("desired_version/gpu-node-3") is None
    store.put_value("desired_version/gpu-node-3", "41")
    store.put_value("desired_version/gpu-node-3", "42")
    store.put_value("replica_counter", "")
    assert store.get_value("desired_version/gpu-node-3") == "42"
    assert store.get_value("replica_counter") == ""


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


def _interface_methods() -> list[str]:
    """The methods the Store protocol declares."""
    return sorted(
        name for name, value in vars(Store).items() if callable(value) and not name.startswith("_")
    )


def test_the_store_protocol_declares_what_the_fleet_calls() -> None:
    """The protocol the check below walks is the fleet's whole use of a store, not an empty list."""
    assert {"get_model", "put_model", "write_replicas", "append_event", "put_value"} <= set(
        _interface_methods()
    )


@pytest.mark.parametrize("name", _interface_methods())
def test_the_store_meets_the_store_interface(name: str) -> None:
    """SQLiteStore has every method of the Store protocol, taking the same parameters (names,
    kinds, defaults), so the fleet can call it through the interface (mypy checks the types)."""
    declared = inspect.signature(getattr(Store, name))
    implemented = inspect.signature(getattr(SQLiteStore, name))
    shape = [(p.name, p.kind, p.default) for p in declared.parameters.values()]
    assert [(p.name, p.kind, p.default) for p in implemented.parameters.values()] == shape


def test_a_closed_store_can_be_closed_again(tmp_path: Path) -> None:
    """close() through the interface releases the file, and a second close does nothing."""
    store: Store = SQLiteStore(tmp_path / "fleet.db")
    store.put_value("k", "v")
    store.close()
    store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        store.get_value("k")


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
        ("postgresql://fleet@db.internal/fleet", "PostgreSQL store is not built yet"),
        ("postgres://fleet@db.internal/fleet", "PostgreSQL store is not built yet"),
        ("postgresql+psycopg://fleet@db/fleet", "PostgreSQL store is not built yet"),
        ("mysql://fleet@db/fleet", "unknown store URL scheme 'mysql'"),
        ("sqlite://", "names no file"),
        ("", "names no file"),
    ],
)
def test_open_store_refuses_what_it_cannot_open(url: str, message: str) -> None:
    """URLs naming another database or no file are refused with a message saying what works."""
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_write_replicas_puts_and_forgets_in_one_transaction(store: SQLiteStore) -> None:
    """A tick's replica changes are written together: puts replace, deletes forget, and a
    failing batch writes nothing."""
    a = ReplicaRecord(id="r-a", model="m", profile="p", revision=1)
    b = ReplicaRecord(id="r-b", model="m", profile="p", revision=1)
    store.write_replicas([a, b], [])
    store.write_replicas([replace(a, phase="READY")], ["r-b"])
    assert [(r.id, r.phase) for r in store.list_replicas()] == [("r-a", "READY")]
    bad = replace(b, spec={"x": float("nan")})
    with pytest.raises(ValueError):
        store.write_replicas([replace(a, phase="STOPPING"), bad], [])
    assert [(r.id, r.phase) for r in store.list_replicas()] == [("r-a", "READY")]
