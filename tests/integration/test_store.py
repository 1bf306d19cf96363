"""The store suite, run against both stores (SQLite and PostgreSQL): revisions and etags,
answers, replicas, values, rollouts and events, racing writers, and rows that do not decode.

PostgreSQL is the test server (tests/support/postgres.py): each test gets a fresh
database, dropped after. Where only one store has something to test (SQLite's file and pragmas,
PostgreSQL's connections), it is in tests/unit/test_store_sqlite.py or
tests/integration/test_store_postgres.py.
"""

from __future__ import annotations

import inspect
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_svc.store.base import (
    BEATS_KEPT_S,
    AnswerRecord,
    DesiredRecord,
    NodeBeat,
    NodeReport,
    NotLeader,
    ReplicaRecord,
    RolloutRecord,
    RolloutRequest,
    StaleRevision,
    Store,
    StoreDamaged,
    TrafficRecord,
)
from fleet_svc.store.postgres import PostgresStore
from fleet_svc.store.sqlite import SQLiteStore
from fleet_svc.store.urls import open_store
from tests.support.postgres import fresh_database
from tests.support.store_records import model

CLOCK = 1_764_000_123.5
"""What the stores' injected clock reads (stamped on answers)."""


@dataclass
class Backend:
    """One store's database: how to open a store on it and run raw SQL against it."""

    kind: str
    url: str
    """What `--store` takes to name this database."""
    opener: Callable[[], Store]
    raw: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
    """Run one statement (`?` placeholders) outside the store, committed; its rows."""

    def open(self) -> Store:
        """A new store on this database."""
        return self.opener()


def _sqlite_backend(path: Path) -> Backend:
    def raw(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            return conn.execute(statement, params).fetchall()

    return Backend("sqlite", str(path), lambda: SQLiteStore(path, clock=lambda: CLOCK), raw)


def _postgres_backend(dsn: str, *, pipelined: bool = False) -> Backend:
    def raw(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(statement.replace("?", "%s").encode(), params)
            return cur.fetchall() if cur.description else []

    def opener() -> Store:
        opened = PostgresStore(dsn, clock=lambda: CLOCK)
        opened.pipelining = pipelined  # the test server is on this machine: not by default
        return opened

    return Backend("postgresql", dsn, opener, raw)


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-pipelined"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store's database, fresh: a file in a temporary folder, or a new PostgreSQL
    database dropped after the test (its statements sent one at a time, as to a server on
    this machine, or pipelined, as to one on another host)."""
    if request.param == "sqlite":
        yield _sqlite_backend(tmp_path / "fleet.db")
    else:
        with fresh_database() as (_name, dsn):
            yield _postgres_backend(dsn, pipelined=request.param == "postgresql-pipelined")


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    """A store on the fresh database, closed after the test."""
    opened = backend.open()
    try:
        yield opened
    finally:
        opened.close()


QWEN_SPEC: dict[str, Any] = {
    "name": "qwen2.5-0.5b",
    "source": "http://127.0.0.1:8000/qwen2.5-0.5b-instruct-q4_k_m.gguf",
    "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_only": True, "min_memory_gb": 2}],
}


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
def test_put_model_revisions(store: Store, steps: list[Step]) -> None:
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


def test_model_fields_round_trip(store: Store) -> None:
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


def test_deleted_model_leaves_get_and_list_but_stays_in_history(store: Store) -> None:
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


def test_list_models_gives_each_latest_revision_by_name(store: Store) -> None:
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


def test_unknown_model_reads_as_absent(store: Store) -> None:
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
    store: Store, deleted_before: bool, expect: int
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
    store: Store, spec: dict[str, Any], error: type[Exception]
) -> None:
    """A spec that could not be read back as JSON is refused at write, and nothing is stored."""
    with pytest.raises(error):
        store.put_model(model(spec=spec), expect_revision=0)
    assert store.model_history("llama-3.1-8b") == []


REPLICAS = [
    ReplicaRecord(id="r-min", model="qwen2.5-0.5b", profile="cpu", revision=1),
    # A replica starting: its agent's last progress report.
    ReplicaRecord(
        id="r-starting",
        model="qwen2.5-0.5b",
        profile="cpu",
        revision=1,
        node="cpu-node-1",
        phase="STARTING",
        reason="fetching qwen2.5-0.5b-q8_0.gguf",
        progress={
            "stage": "DOWNLOADING",
            "done_bytes": 201_326_592,
            "total_bytes": 531_067_296,
            "rate_bytes_per_s": 52_428_800,
            "files_done": 0,
            "files_total": 1,
            "file": "qwen2.5-0.5b-q8_0.gguf",
        },
    ),
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
    # A gang: one replica over two nodes, each member's node, cards, phase and address.
    ReplicaRecord(
        id="r-gang",
        model="llama-3.1-70b",
        profile="two-nodes",
        revision=2,
        node="gpu-node-1",
        gpus=(0, 1, 2, 3),
        phase="READY",
        address="10.0.1.5:8000",
        spec={"engine": "vllm", "args": ["-tp", "4", "-pp", "2"]},
        members=(
            {
                "rank": 0,
                "node": "gpu-node-1",
                "gpus": [0, 1, 2, 3],
                "phase": "READY",
                "gang_address": "10.0.1.5:29501",
            },
            {
                "rank": 1,
                "node": "gpu-node-2",
                "gpus": [4, 5, 6, 7],
                "phase": "READY",
                "gang_address": "",
            },
        ),
    ),
]


@pytest.mark.parametrize("record", REPLICAS, ids=[r.id for r in REPLICAS])
def test_replica_insert_replace_delete(store: Store, record: ReplicaRecord) -> None:
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


def test_a_replica_row_from_before_gangs_reads_as_one_node_after_migrating(
    backend: Backend,
) -> None:
    """A database of the schema before gang membership (no members column) keeps its replica
    rows: migrated forward, each reads as a replica on one node."""
    backend.open().close()
    backend.raw("ALTER TABLE replicas DROP COLUMN members", ())
    # And what later steps added, so the database is as a fleet of schema 3 left it.
    backend.raw("ALTER TABLE replicas DROP COLUMN progress", ())
    backend.raw("DROP TABLE rollout_requests", ())
    backend.raw("DROP INDEX rollouts_by_state", ())
    backend.raw("DROP TABLE traffic_reports", ())
    backend.raw("DROP TABLE node_reports", ())
    backend.raw("DROP TABLE desired_sets", ())
    backend.raw("DROP TABLE node_beats", ())
    if backend.kind == "sqlite":
        backend.raw("PRAGMA user_version = 3", ())
    else:
        backend.raw("DELETE FROM schema_version WHERE version >= 4", ())
    backend.raw(
        "INSERT INTO replicas (id, model, profile, revision, node, gpus, phase, reason,"
        " address, restarts, since, spec) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            "r-old",
            "m",
            "p",
            1,
            "node-1",
            "[0]" if backend.kind == "sqlite" else [0],
            "READY",
            "",
            "10.0.0.1:8000",
            0,
            1.0,
            '{"engine": "vllm"}',
        ),
    )
    store = backend.open()
    try:
        [old] = store.list_replicas()
        assert (old.id, old.node, old.members) == ("r-old", "node-1", ())
        gang = replace(old, members=({"rank": 0, "node": "node-1"}, {"rank": 1, "node": "n2"}))
        store.put_replica(gang)
        assert store.list_replicas() == [gang]
    finally:
        store.close()


def test_replicas_are_listed_by_id(store: Store) -> None:
    """Several replicas are all listed, in id order, whatever order they were written in."""
    for record in reversed(REPLICAS):
        store.put_replica(record)
    assert store.list_replicas() == sorted(REPLICAS, key=lambda r: r.id)


def test_values_store_replace_and_default_to_none(store: Store) -> None:
    """A value reads back as last written; a key never set reads as None."""
    assert store.get_value("desired_version/gpu-node-3") is None
    store.put_value("desired_version/gpu-node-3", "41")
    store.put_value("desired_version/gpu-node-3", "42")
    store.put_value("replica_counter", "")
    assert store.get_value("desired_version/gpu-node-3") == "42"
    assert store.get_value("replica_counter") == ""


def test_write_replicas_puts_and_forgets_in_one_transaction(store: Store) -> None:
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


# Racing writers ---------------------------------------------------------------------------------


def test_racing_writers_with_one_etag_yield_exactly_one_winner(backend: Backend) -> None:
    """Two stores on one database in two threads, writing on the same etag at once: one wins
    each round and the other is told the winner's revision."""
    backend.open().close()
    rounds = 25
    barrier = threading.Barrier(2)
    outcomes: dict[str, list[int | StaleRevision]] = {"a": [], "b": []}
    failures: list[BaseException] = []

    def writer(who: str) -> None:
        try:
            mine = backend.open()
            try:
                for expect in range(rounds):
                    barrier.wait(timeout=10)
                    try:
                        written = mine.put_model(model(updated_by=who), expect_revision=expect)
                        outcomes[who].append(written.revision)
                    except StaleRevision as stale:
                        outcomes[who].append(stale)
                    # Both writers see the round's winner before the next round starts.
                    barrier.wait(timeout=10)
            finally:
                mine.close()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    reader = backend.open()
    try:
        history = reader.model_history("llama-3.1-8b")
    finally:
        reader.close()
    assert [r.revision for r in history] == list(range(1, rounds + 1))
    for n, (a, b) in enumerate(zip(outcomes["a"], outcomes["b"], strict=True)):
        won = [x for x in (a, b) if isinstance(x, int)]
        lost = [x for x in (a, b) if isinstance(x, StaleRevision)]
        assert won == [n + 1], f"round {n}: {a!r} / {b!r}"
        assert [(s.expected, s.current) for s in lost] == [(n, n + 1)]
        assert history[n].updated_by == ("a" if isinstance(a, int) else "b")


def test_racing_first_answers_keep_exactly_one(backend: Backend) -> None:
    """Four stores answering the same request ids at once: each id keeps one answer, the same
    one every reader sees, and it is one of those written."""
    backend.open().close()
    ids = [f"req-{i}" for i in range(30)]
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def answerer(who: int) -> None:
        try:
            mine = backend.open()
            try:
                barrier.wait(timeout=10)
                for request_id in ids:
                    mine.put_answer(request_id, "CreateModel", f"{who}:{request_id}".encode())
            finally:
                mine.close()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=answerer, args=(who,)) for who in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    stores = [backend.open(), backend.open()]
    try:
        for request_id in ids:
            first, second = (s.get_answer(request_id) for s in stores)
            assert first == second and first is not None
            who, _, answered = first.answer.decode().partition(":")
            assert answered == request_id and int(who) in range(4)
    finally:
        for s in stores:
            s.close()


def test_racing_appends_give_each_event_its_own_seq(backend: Backend) -> None:
    """Three stores appending to one rollout at once: seqs run 1..N with no gap and no repeat,
    and every event is kept."""
    setup = backend.open()
    setup.put_rollout(RolloutRecord("ro-1", "m", "RUNNING", {}, 1.0, 1.0))
    setup.close()
    per_writer = 20
    failures: list[BaseException] = []
    seqs: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def appender(who: int) -> None:
        try:
            mine = backend.open()
            try:
                barrier.wait(timeout=10)
                for i in range(per_writer):
                    seq = mine.append_event("ro-1", float(i), {"who": who, "i": i})
                    with lock:
                        seqs.append(seq)
            finally:
                mine.close()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=appender, args=(who,)) for who in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert sorted(seqs) == list(range(1, 3 * per_writer + 1))
    reader = backend.open()
    try:
        events = reader.list_events("ro-1")
    finally:
        reader.close()
    assert [e.seq for e in events] == list(range(1, 3 * per_writer + 1))
    assert sorted((e.event["who"], e.event["i"]) for e in events) == sorted(
        (w, i) for w in range(3) for i in range(per_writer)
    )


# Answers ----------------------------------------------------------------------------------------


def test_first_answer_to_a_request_wins(store: Store) -> None:
    """A second answer to the same request id is ignored; other ids are separate."""
    assert store.get_answer("req-1") is None
    store.put_answer("req-1", "CreateModel", b"\x08\x01first\x00")
    store.put_answer("req-1", "DeleteModel", b"second")
    store.put_answer("req-2", "UpdateModel", b"")
    first, second = store.get_answer("req-1"), store.get_answer("req-2")
    assert first is not None and (first.method, first.answer) == (
        "CreateModel",
        b"\x08\x01first\x00",
    )
    assert second is not None and (second.method, second.answer) == ("UpdateModel", b"")


def test_answers_are_stamped_with_the_injected_clock(store: Store, backend: Backend) -> None:
    """An answer's creation time is the store's clock at the first write."""
    store.put_answer("req-1", "CreateModel", b"x")
    assert backend.raw("SELECT created_at FROM answers", ()) == [(CLOCK,)]


def test_an_answer_keeps_its_fingerprint_and_time(store: Store) -> None:
    """An answer reads back with the fingerprint of its request and when it was stored."""
    store.put_answer("req-1", "SetGPUs", b"a", fingerprint="f" * 64)
    stored = store.get_answer("req-1")
    assert stored == AnswerRecord("SetGPUs", b"a", "f" * 64, CLOCK)


def test_a_claimed_id_is_filled_once_and_taken_for_others(store: Store) -> None:
    """claim_answer reserves an id once; put_answer fills the claim of the same request, and
    neither replaces an answer already there."""
    assert store.claim_answer("req-1", "SetGPUs", "fp")
    assert not store.claim_answer("req-1", "SetGPUs", "fp")
    store.put_answer("req-1", "SetGPUs", b"other", fingerprint="not-fp")
    store.put_answer("req-1", "SetGPUs", b"answer", fingerprint="fp")
    store.put_answer("req-1", "SetGPUs", b"later", fingerprint="fp")
    stored = store.get_answer("req-1")
    assert stored is not None and stored.answer == b"answer"


def test_answers_older_than_a_time_are_pruned(store: Store, backend: Backend) -> None:
    """prune_answers forgets the answers stored before the time it is given, and only those."""
    store.put_answer("old", "CreateModel", b"x")
    backend.raw("UPDATE answers SET created_at = ? WHERE request_id = ?", (CLOCK - 100, "old"))
    store.put_answer("new", "CreateModel", b"y")
    assert store.prune_answers(CLOCK - 50) == 1
    assert store.get_answer("old") is None and store.get_answer("new") is not None


def test_a_forgotten_answer_frees_its_id_and_only_its_id(store: Store) -> None:
    """forget_answer drops one id's answer, so the id can be claimed and answered anew in the
    same atomic block; other ids keep theirs."""
    store.put_answer("gone", "CreateModel", b"old", fingerprint="fp")
    store.put_answer("kept", "CreateModel", b"k", fingerprint="fp")
    with store.atomic():
        store.forget_answer("gone")
        assert store.claim_answer("gone", "CreateModel", "fp")
        store.put_answer("gone", "CreateModel", b"new", fingerprint="fp")
    gone, kept = store.get_answer("gone"), store.get_answer("kept")
    assert gone is not None and gone.answer == b"new"
    assert kept is not None and kept.answer == b"k"


def test_an_atomic_block_keeps_all_its_writes_or_none(store: Store) -> None:
    """Writes in an atomic block that raises are all undone (a catalog revision, a rollout and
    its event, an answer); a block that ends keeps them all, inner blocks included."""
    with pytest.raises(RuntimeError), store.atomic():
        store.put_model(model("m"), expect_revision=0)
        store.put_rollout(RolloutRecord("ro-1", "m", "RUNNING", {}, 1.0, 1.0))
        store.append_event("ro-1", 1.0, {"kind": "rollout_started"})
        store.put_answer("req-1", "SetGPUs", b"a")
        raise RuntimeError("the change failed half-way")
    assert store.get_model("m") is None and store.get_rollout("ro-1") is None
    assert store.get_answer("req-1") is None and store.list_events("ro-1") == []
    with store.atomic():
        store.put_model(model("m"), expect_revision=0)
        with pytest.raises(StaleRevision), store.atomic():
            store.put_model(model("m"), expect_revision=0)
        store.put_answer("req-1", "SetGPUs", b"a")
    assert [r.revision for r in store.model_history("m")] == [1]
    assert store.get_answer("req-1") is not None


# Rollouts and events ----------------------------------------------------------------------------

ROLLOUT_SPEC: dict[str, Any] = {
    "kind": "context",
    "strategy": "beside",
    "from_revision": 3,
    "to_revision": 4,
    "steps": [{"profile": "h100", "old_id": "r-1", "new_id": "", "stage": "waiting"}],
    "log_tail": ["starting …", "ok"],
}


def test_a_rollout_is_replaced_but_keeps_its_creation_time(store: Store) -> None:
    """A rollout written again has its new state and spec, and the time it was first written."""
    first = RolloutRecord("ro-1", "llama", "RUNNING", ROLLOUT_SPEC, 100.25, 100.25)
    store.put_rollout(first)
    assert store.get_rollout("ro-1") == first
    done = replace(first, state="SUCCEEDED", spec={"steps": []}, created_at=999.0, updated_at=150.5)
    store.put_rollout(done)
    assert store.get_rollout("ro-1") == replace(done, created_at=100.25)
    assert store.get_rollout("ro-nope") is None


def test_rollouts_are_listed_newest_first_by_model(store: Store) -> None:
    """Listing gives every rollout newest first (id breaking ties), or one model's."""
    for rid, model_name, at in [("ro-a", "m1", 10.0), ("ro-b", "m2", 30.0), ("ro-c", "m1", 20.0)]:
        store.put_rollout(RolloutRecord(rid, model_name, "RUNNING", {}, at, at))
    store.put_rollout(RolloutRecord("ro-d", "m1", "FAILED", {}, 20.0, 21.0))
    assert [r.id for r in store.list_rollouts()] == ["ro-b", "ro-d", "ro-c", "ro-a"]
    assert [r.id for r in store.list_rollouts("m1")] == ["ro-d", "ro-c", "ro-a"]
    assert store.list_rollouts("m3") == []
    assert [r.id for r in store.list_rollouts(states=("FAILED", "PENDING"))] == ["ro-d"]
    assert [r.id for r in store.list_rollouts("m1", states=("RUNNING",))] == ["ro-c", "ro-a"]


def test_what_a_change_reads_first_is_the_latest_revision_and_its_rollouts(store: Store) -> None:
    """model_to_change answers as get_model and list_rollouts of the model's `states` do,
    within an atomic block too: nothing for a model never written, no revision once deleted
    (its rollouts still listed)."""
    assert store.model_to_change("llama-3.1-8b", ("RUNNING",)) == (None, [])
    store.put_model(model(), expect_revision=0)
    store.put_model(model(updated_by="bob@example.com"), expect_revision=1)
    for rid, state, at in [("ro-a", "SUCCEEDED", 10.0), ("ro-b", "RUNNING", 20.0)]:
        store.put_rollout(RolloutRecord(rid, "llama-3.1-8b", state, {}, at, at))
    store.put_rollout(RolloutRecord("ro-c", "other", "RUNNING", {}, 30.0, 30.0))
    latest, running = store.model_to_change("llama-3.1-8b", ("PENDING", "RUNNING"))
    assert latest == store.get_model("llama-3.1-8b") and latest is not None
    assert latest.revision == 2 and [r.id for r in running] == ["ro-b"]
    with store.atomic():
        assert store.model_to_change("llama-3.1-8b", ("PENDING", "RUNNING")) == (latest, running)
    store.put_model(model(deleted=True), expect_revision=2)
    gone, still = store.model_to_change("llama-3.1-8b", ("RUNNING", "SUCCEEDED"))
    assert gone is None and [r.id for r in still] == ["ro-b", "ro-a"]


def test_a_rollout_request_is_kept_until_carried_out(store: Store) -> None:
    """Requests to cancel a rollout are listed oldest first, a repeated id is kept once, and
    they are gone once deleted, in one transaction with other writes."""
    first = RolloutRequest("rq-1", "ro-1", "cancel", "cancelled by bob", "bob", 20.0)
    second = RolloutRequest("rq-2", "ro-2", "cancel", "superseded", "carol", 10.0)
    with store.atomic():
        store.put_rollout_request(first)
        store.put_rollout_request(second)
        store.put_rollout_request(replace(first, reason="again"))
    assert store.list_rollout_requests() == [second, first]
    with pytest.raises(RuntimeError), store.atomic():
        store.delete_rollout_requests(["rq-1", "rq-2"])
        raise RuntimeError("rolled back")
    assert store.list_rollout_requests() == [second, first]
    store.delete_rollout_requests(["rq-2"])
    store.delete_rollout_requests([])
    assert store.list_rollout_requests() == [first]


def test_events_are_numbered_per_rollout_and_read_after_a_seq(store: Store) -> None:
    """Each rollout's events count 1, 2, 3 …; reading after a seq gives the later ones in order,
    every field as written."""
    for rid in ("ro-1", "ro-2"):
        store.put_rollout(RolloutRecord(rid, "m", "RUNNING", {}, 1.0, 1.0))
    assert store.append_event("ro-1", 10.5, {"kind": "rollout_started", "gpus": [0, 1]}) == 1
    assert store.append_event("ro-2", 11.0, {"kind": "rollout_started"}) == 1
    assert store.append_event("ro-1", 12.25, {"kind": "step_done", "message": "é ✓"}) == 2
    assert store.append_event("ro-1", 13.0, {"kind": "rollout_succeeded"}) == 3
    events = store.list_events("ro-1")
    assert [(e.rollout_id, e.seq, e.at, e.event["kind"]) for e in events] == [
        ("ro-1", 1, 10.5, "rollout_started"),
        ("ro-1", 2, 12.25, "step_done"),
        ("ro-1", 3, 13.0, "rollout_succeeded"),
    ]
    assert events[0].event == {"kind": "rollout_started", "gpus": [0, 1]}
    assert events[1].event["message"] == "é ✓"
    assert [e.seq for e in store.list_events("ro-1", after_seq=1)] == [2, 3]
    assert store.list_events("ro-1", after_seq=3) == []
    assert [e.seq for e in store.list_events("ro-2")] == [1]


# The interface ----------------------------------------------------------------------------------


def _interface_methods() -> list[str]:
    """The methods the Store protocol declares."""
    return sorted(
        name for name, value in vars(Store).items() if callable(value) and not name.startswith("_")
    )


def test_the_store_protocol_declares_what_the_fleet_calls() -> None:
    """The protocol the check below walks is the fleet's whole use of a store, not an empty list."""
    assert {
        "get_model",
        "put_model",
        "write_replicas",
        "append_event",
        "put_value",
        "probe",
        "verify",
    } <= set(_interface_methods())


@pytest.mark.parametrize("cls", [SQLiteStore, PostgresStore], ids=["sqlite", "postgresql"])
@pytest.mark.parametrize("name", _interface_methods())
def test_each_store_meets_the_store_interface(cls: type[Any], name: str) -> None:
    """Each store has every method of the Store protocol, taking the same parameters (names,
    kinds, defaults), so the fleet can call it through the interface (mypy checks the types)."""
    declared = inspect.signature(getattr(Store, name))
    implemented = inspect.signature(getattr(cls, name))
    shape = [(p.name, p.kind, p.default) for p in declared.parameters.values()]
    assert [(p.name, p.kind, p.default) for p in implemented.parameters.values()] == shape


def test_a_closed_store_can_be_closed_again(backend: Backend) -> None:
    """close() releases the database, a second close does nothing, and a call after it raises."""
    store = backend.open()
    store.put_value("k", "v")
    store.close()
    store.close()
    with pytest.raises(Exception, match=r"(?i)closed"):
        store.get_value("k")


def test_reopening_keeps_everything(backend: Backend) -> None:
    """What one store wrote, another opened on the same database reads (migrations applied
    once, nothing reset)."""
    first = backend.open()
    first.put_model(model(), expect_revision=0)
    first.put_value("desired_version", "7")
    first.close()
    second = open_store(backend.url)
    try:
        assert [m.revision for m in second.list_models()] == [1]
        assert second.get_value("desired_version") == "7"
        second.probe()
    finally:
        second.close()


# Rows that do not decode --------------------------------------------------------------------------

BROKEN_ROWS = [
    # (what, statement breaking one row, table, key)
    (
        "a profile list that is a number",
        'UPDATE model_revisions SET spec = \'{"name":"llama-3.1-8b","profiles":5}\'',
        "model_revisions",
        "llama-3.1-8b@1",
    ),
    (
        "a spec that is a list",
        "UPDATE model_revisions SET spec = '[1, 2]'",
        "model_revisions",
        "llama-3.1-8b@1",
    ),
    ("a replica spec that is a string", "UPDATE replicas SET spec = '\"x\"'", "replicas", "r-1"),
    (
        "a rollout in an unknown state",
        "UPDATE rollouts SET state = 'EXPLODED'",
        "rollouts",
        "ro-1",
    ),
    (
        "a rollout step that is not an object",
        "UPDATE rollouts SET spec = '{\"steps\": [7]}'",
        "rollouts",
        "ro-1",
    ),
    (
        "an event that is a number",
        "UPDATE rollout_events SET event = '3'",
        "rollout_events",
        "ro-1#1",
    ),
]


def _fill(store: Store) -> None:
    store.put_model(model(), expect_revision=0)
    store.put_replica(ReplicaRecord(id="r-1", model="llama-3.1-8b", profile="h100", revision=1))
    store.put_rollout(RolloutRecord("ro-1", "llama-3.1-8b", "RUNNING", ROLLOUT_SPEC, 1.0, 1.0))
    store.append_event("ro-1", 1.0, {"kind": "rollout_started"})


@pytest.mark.parametrize(
    ("statement", "table", "key"),
    [row[1:] for row in BROKEN_ROWS],
    ids=[row[0] for row in BROKEN_ROWS],
)
def test_opening_refuses_a_store_with_a_row_it_cannot_read(
    backend: Backend, statement: str, table: str, key: str
) -> None:
    """A row that is valid JSON but not what the fleet reads is found when the store opens, and
    the refusal names the store, the table and the row's key."""
    store = backend.open()
    _fill(store)
    store.close()
    backend.raw(statement, ())
    with pytest.raises(StoreDamaged) as refused:
        open_store(backend.url)
    assert (refused.value.table, refused.value.key) == (table, key)
    message = str(refused.value)
    assert key in message and table in message
    assert message.startswith("the fleet store ")


def test_a_row_broken_after_opening_is_skipped_in_listings_and_fails_the_probe(
    store: Store, backend: Backend
) -> None:
    """Damage found at run time: a listing people read leaves the broken rollout out (the
    others still listed), a read the fleet acts on raises naming the row, and from then on
    the probe reports it (so health is NOT_SERVING)."""
    _fill(store)
    store.put_rollout(RolloutRecord("ro-2", "llama-3.1-8b", "SUCCEEDED", {}, 2.0, 2.0))
    store.probe()
    backend.raw("UPDATE rollouts SET spec = '[]' WHERE id = ?", ("ro-1",))
    backend.raw("UPDATE model_revisions SET spec = '\"gone\"'", ())
    assert [r.id for r in store.list_rollouts()] == ["ro-2"]
    with pytest.raises(StoreDamaged, match=r"llama-3\.1-8b@1"):
        store.get_model("llama-3.1-8b")
    with pytest.raises(StoreDamaged, match="ro-1"):
        store.probe()


def test_a_claim_racing_another_finds_the_id_taken_once_it_commits(backend: Backend) -> None:
    """Two atomic blocks claiming one request id: the second waits for the first (SQLite's
    write lock, PostgreSQL's primary key), then finds the id taken and reads its answer."""
    backend.open().close()
    claimed = threading.Event()
    results: list[bool] = []
    failures: list[BaseException] = []

    def first() -> None:
        try:
            mine = backend.open()
            try:
                with mine.atomic():
                    results.append(mine.claim_answer("req-1", "SetGPUs", "fp"))
                    claimed.set()
                    time.sleep(0.2)  # hold the claim while the other tries
                    mine.put_answer("req-1", "SetGPUs", b"first", fingerprint="fp")
            finally:
                mine.close()
        except BaseException as exc:
            failures.append(exc)
            claimed.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert claimed.wait(timeout=10)
    second = backend.open()
    try:
        with second.atomic():
            results.append(second.claim_answer("req-1", "SetGPUs", "fp"))
            seen = second.get_answer("req-1")
    finally:
        second.close()
    thread.join(timeout=30)
    assert not failures
    assert results == [True, False]
    assert seen is not None and seen.answer == b"first"


# Traffic reports ------------------------------------------------------------------------------


def test_traffic_is_kept_once_per_gateway_and_interval_and_pruned_by_age(store: Store) -> None:
    """A (gateway, interval) is kept once (a repeat writes nothing and says so), another
    gateway's report of the same interval is its own, listings are per model from a start,
    and reports older than the prune bound are forgotten."""

    def rec(
        gateway: str, start_ms: int, rid: str, model: str = "m", requests: int = 1
    ) -> TrafficRecord:
        return TrafficRecord(gateway, start_ms, rid, model, 2, 1, {"requests": requests}, 5.0)

    assert store.put_traffic(
        [rec("a", 1000, "r1"), rec("a", 1000, "r2", "other")], prune_before_ms=0
    )
    assert not store.put_traffic([rec("a", 1000, "r1", requests=99)], prune_before_ms=0)
    assert store.put_traffic([rec("b", 1000, "r1")], prune_before_ms=0)
    assert store.put_traffic([rec("a", 2000, "r1")], prune_before_ms=0)
    listed = store.list_traffic("m", 1000)
    assert [(r.gateway, r.interval_start_ms, r.figures["requests"]) for r in listed] == [
        ("a", 1000, 1),
        ("b", 1000, 1),
        ("a", 2000, 1),
    ]
    assert [r.replica_id for r in store.list_traffic("other", 0)] == ["r2"]
    assert [r.interval_start_ms for r in store.list_traffic("m", 1500)] == [2000]
    assert store.put_traffic([rec("c", 3000, "r1")], prune_before_ms=2000)
    assert [r.interval_start_ms for r in store.list_traffic("m", 0)] == [2000, 3000]


def test_node_reports_are_read_after_a_seq_and_replaced_by_node(store: Store) -> None:
    """Node reports read back as written, in the order written; a node's newer report
    replaces its older at a higher seq, and a read after a seq returns only what is newer."""
    a = NodeReport("node-a", "fleet-1", "s1", True, 10.0, {"view": {"cards": []}})
    b = NodeReport("node-b", "fleet-2", "s2", True, 11.0, {"observed": [{"replica_id": "r"}]})
    store.put_node_reports([a, b])
    first = store.list_node_reports()
    assert [(r.node, r.holder, r.stream, r.connected, r.heard_at, r.report) for r in first] == [
        ("node-a", "fleet-1", "s1", True, 10.0, a.report),
        ("node-b", "fleet-2", "s2", True, 11.0, b.report),
    ]
    assert first[0].seq < first[1].seq
    gone = replace(a, connected=False, heard_at=12.0)
    store.put_node_reports([gone])
    newer = store.list_node_reports(first[1].seq)
    assert [(r.node, r.connected, r.heard_at) for r in newer] == [("node-a", False, 12.0)]
    assert newer[0].seq > first[1].seq
    assert [r.node for r in store.list_node_reports()] == ["node-b", "node-a"]
    store.put_node_reports([])
    assert store.list_node_reports(newer[0].seq) == []


def test_a_node_report_read_again_is_the_one_written_last(store: Store) -> None:
    """Reading a node's row again gives its latest report, whether it was refreshed with the
    same report (a holder's refresh) or changed, however often it was read before."""
    a = NodeReport("node-a", "fleet-2", "s1", True, 10.0, {"ack": {"version": 1}})
    store.put_node_reports([a])
    [first] = store.list_node_reports()
    store.put_node_reports([replace(a, heard_at=11.0)])
    [same] = store.list_node_reports(first.seq)
    assert (same.heard_at, same.report) == (11.0, a.report)
    store.put_node_reports([replace(a, heard_at=12.0, report={"ack": {"version": 2}})])
    [changed] = store.list_node_reports(same.seq)
    assert (changed.heard_at, changed.report) == (12.0, {"ack": {"version": 2}})
    assert [r.report for r in store.list_node_reports()] == [{"ack": {"version": 2}}]


def test_holders_beats_are_read_after_a_seq_replaced_by_holder_and_pruned(store: Store) -> None:
    """A holder's beat reads back as written, at a seq that grows with every beat; a holder's
    newer beat replaces its older; one written with node reports commits with them; a beat
    older than BEATS_KEPT_S before the newest written is dropped."""
    store.put_node_reports([], NodeBeat("fleet-2", {"node-a": 10.5, "node-b": 9.0}, 11.0))
    [first] = store.list_node_beats()
    assert (first.holder, first.heard, first.at) == (
        "fleet-2",
        {"node-a": 10.5, "node-b": 9.0},
        11.0,
    )
    a = NodeReport("node-c", "fleet-3", "s1", True, 12.0, {})
    store.put_node_reports([a], NodeBeat("fleet-3", {"node-c": 12.0}, 12.0))
    store.put_node_reports([], NodeBeat("fleet-2", {"node-a": 13.0}, 13.0))
    newer = store.list_node_beats(first.seq)
    assert [(b.holder, b.heard) for b in newer] == [
        ("fleet-3", {"node-c": 12.0}),
        ("fleet-2", {"node-a": 13.0}),
    ]
    assert newer[0].seq < newer[1].seq
    assert [r.node for r in store.list_node_reports()] == ["node-c"]
    store.put_node_reports([], NodeBeat("fleet-3", {}, 13.0 + BEATS_KEPT_S - 1))
    assert [b.holder for b in store.list_node_beats()] == ["fleet-2", "fleet-3"]
    store.put_node_reports([], NodeBeat("fleet-3", {}, 13.0 + BEATS_KEPT_S + 1))
    assert [b.holder for b in store.list_node_beats()] == ["fleet-3"]


def test_desired_sets_are_read_after_a_seq_and_replaced_by_node(store: Store) -> None:
    """Desired sets read back byte for byte by seq; a node's newer set replaces its older."""
    store.put_desired([DesiredRecord("node-a", 3, b"\x00\x01set"), DesiredRecord("node-b", 4, b"")])
    first = store.list_desired()
    assert [(d.node, d.version, d.body) for d in first] == [
        ("node-a", 3, b"\x00\x01set"),
        ("node-b", 4, b""),
    ]
    store.put_desired([DesiredRecord("node-a", 5, b"newer")])
    newer = store.list_desired(first[-1].seq)
    assert [(d.node, d.version, d.body) for d in newer] == [("node-a", 5, b"newer")]
    assert len(store.list_desired()) == 2


def test_a_fenced_store_refuses_a_stale_leaders_desired_sets_but_takes_node_reports(
    backend: Backend,
) -> None:
    """On PostgreSQL desired sets are the leader's fenced writes: fenced with an epoch the
    lease no longer holds, they are refused and nothing is written; node reports are written
    by whichever fleet holds a stream, fenced or not."""
    if backend.kind != "postgresql":
        pytest.skip("only PostgreSQL has a lease")
    store = backend.open()
    try:
        assert isinstance(store, PostgresStore)
        store.acquire_lease("a", "127.0.0.1:1", 30)
        store.fence(99)
        with pytest.raises(NotLeader):
            store.put_desired([DesiredRecord("node-a", 1, b"x")])
        assert store.list_desired() == []
        store.put_node_reports([NodeReport("node-a", "b", "s", True, 1.0, {})])
        assert [r.node for r in store.list_node_reports()] == ["node-a"]
    finally:
        store.close()
