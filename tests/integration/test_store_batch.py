"""The PostgreSQL store's batched statements (fleet_svc/store/postgres_batch.py): a change's
transaction in three round trips to the server, or in one with its checks made at its commit,
and a batch's transaction as whole as one sent a statement at a time — against the real test
server, one fresh database each. Round trips are counted from libpq's trace of the connection
(one ReadyForQuery from the server ends each)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import psycopg
import pytest
from psycopg import pq

from fleet_svc.store.base import ChecksFailed, ModelRecord, NotLeader, StoreDamaged
from fleet_svc.store.postgres import PostgresStore
from fleet_svc.store.postgres_batch import BatchingConnection
from tests.support.postgres import fresh_database


@pytest.fixture
def dsn() -> Iterator[str]:
    """A fresh database's DSN."""
    with fresh_database() as (_name, made):
        yield made


@pytest.fixture
def conn(dsn: str) -> Iterator[BatchingConnection]:
    """A batching connection (autocommit, as the store's pool makes them) to a table `t`."""
    with BatchingConnection.connect(dsn, autocommit=True) as made:
        made.execute("CREATE TABLE t (n int PRIMARY KEY)")
        yield made


@contextmanager
def round_trips(conn: psycopg.Connection[tuple[object, ...]]) -> Iterator[list[str]]:
    """The block's round trips on `conn`: each the frontend messages sent before the server's
    ReadyForQuery (filled in as the block ends)."""
    trips: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield trips
        finally:
            conn.pgconn.untrace()
            trace.seek(0)
            sent: list[str] = []
            for line in trace.read().splitlines():
                fields = line.split("\t")
                if fields[0] not in ("F", "B"):
                    if sent:  # a statement's own line break: the message goes on
                        sent[-1] += " " + line
                    continue
                if fields[0] == "F":
                    sent.append(" ".join(fields[2:]))
                elif len(fields) > 2 and fields[2] == "ReadyForQuery":
                    trips.append(" | ".join(sent))
                    sent = []


def _rows(dsn: str, statement: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as other:
        return other.execute(statement.encode()).fetchall()


def _model(name: str = "m") -> ModelRecord:
    return ModelRecord(name=name, revision=0, spec={"name": name}, updated_by="t", updated_at=1.0)


def test_a_fenced_change_is_three_round_trips_and_keeps_its_writes(dsn: str) -> None:
    """A change as the fleet makes it (claim the request id, write the revision, keep the
    answer, in one fenced transaction) reaches the server in three round trips: BEGIN, the
    fence and the claim; the revision; the answer and COMMIT. All of it lands."""
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        store.fence(store.acquire_lease("a", "a:1", 30).epoch)
        # The trace ends after the block's COMMIT.
        with ExitStack() as traced, store.atomic():
            pinned = store.link.pinned()
            assert pinned is not None
            trips = traced.enter_context(round_trips(pinned))
            assert store.claim_answer("req-1", "SetContext", "fp")
            written = store.put_model(_model(), expect_revision=1)
            store.put_answer("req-1", "SetContext", b"answer", fingerprint="fp")
        assert written.revision == 2
        assert len(trips) == 3, trips
        assert "BEGIN; SELECT holder" in trips[0] and "INSERT INTO answers" in trips[0]
        assert trips[2].endswith('; COMMIT"')
        answer = store.get_answer("req-1")
        assert answer is not None and answer.answer == b"answer"
        assert [m.revision for m in store.model_history("m")] == [1, 2]


def test_a_change_of_a_deposed_leader_lands_nothing_though_its_answer_waited(dsn: str) -> None:
    """The fence goes with a block's first statement and is read before its COMMIT: a block
    whose epoch is over is refused there, and neither its claim nor the answer queued for the
    COMMIT lands."""
    with PostgresStore(dsn) as a, PostgresStore(dsn) as b:
        a.fence(a.acquire_lease("a", "a:1", 30).epoch)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("UPDATE leases SET epoch = epoch + 1, holder = 'b', address = 'b:1'")
        with pytest.raises(NotLeader) as refused, a.atomic():
            a.claim_answer("req-1", "SetContext", "fp")
            a.put_answer("req-1", "SetContext", b"answer", fingerprint="fp")
        assert refused.value.leader == "b"
        assert b.get_answer("req-1") is None


def test_a_write_queued_for_the_commit_that_fails_rolls_the_block_back(
    conn: BatchingConnection, dsn: str
) -> None:
    """A queued write's failure comes at the COMMIT it went with: the batch raises it, the
    writes sent before it are rolled back, and the connection is idle for its next user."""
    with pytest.raises(psycopg.errors.DivisionByZero), conn.batch():
        conn.execute("INSERT INTO t VALUES (1)")
        conn.write_later("INSERT INTO t VALUES (1 / 0)")
    assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert _rows(dsn, "SELECT n FROM t") == []
    with conn.batch():
        conn.execute("INSERT INTO t VALUES (2)")
    assert _rows(dsn, "SELECT n FROM t") == [(2,)]


def test_a_block_that_raises_before_sending_costs_no_round_trip(
    conn: BatchingConnection,
) -> None:
    """A batch that raises, or ends, before any statement was run sends nothing, not even
    its BEGIN, and what was queued is dropped with it; one that raises after is rolled back."""
    with round_trips(conn) as trips:
        with pytest.raises(RuntimeError), conn.batch():
            conn.queue("INSERT INTO t VALUES (9)")
            raise RuntimeError("refused before any statement")
        with conn.batch():
            conn.queue("INSERT INTO t VALUES (8)")
    assert trips == []
    with round_trips(conn) as trips, pytest.raises(RuntimeError), conn.batch():
        conn.write_later("INSERT INTO t VALUES (1)")  # the first statement: run at once
        raise RuntimeError("refused after a write")
    assert len(trips) == 2 and "BEGIN; INSERT INTO t" in trips[0] and "ROLLBACK" in trips[1]
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_transaction_inside_a_batch_is_a_savepoint(conn: BatchingConnection, dsn: str) -> None:
    """psycopg's transaction inside a batch (an atomic block inside another) sends what is
    queued first, so it is a savepoint of the batch's transaction: rolling it back keeps the
    batch's other writes, which commit with it."""
    with conn.batch():
        with conn.transaction(force_rollback=True):  # the first statement of the batch
            conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (2)")
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (3)")
    assert _rows(dsn, "SELECT n FROM t ORDER BY n") == [(2,), (3,)]


def test_a_damaged_table_met_at_the_commit_is_damage(dsn: str) -> None:
    """A write queued for an atomic block's COMMIT that finds the schema damaged (its table
    gone) is reported as StoreDamaged, as the same write sent on its own is."""
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("ALTER TABLE answers RENAME TO answers_gone")
        with pytest.raises(StoreDamaged), store.atomic():
            store.put_model(_model(), expect_revision=1)
            store.put_answer("req-1", "SetContext", b"answer")
        assert [m.revision for m in store.model_history("m")] == [1]


def _change(store: PostgresStore, request_id: str, expect: int) -> ModelRecord:
    """A change as the fleet makes it, checked at its commit: claim, revision, answer."""
    with store.atomic(checked_at_commit=True):
        assert store.claim_answer(request_id, "SetContext", "fp")
        written = store.put_model(_model(), expect_revision=expect)
        store.put_answer(
            request_id, "SetContext", b"answer-" + request_id.encode(), fingerprint="fp"
        )
    return written


def test_a_change_checked_at_its_commit_is_one_round_trip_and_keeps_its_writes(
    dsn: str,
) -> None:
    """Checked at its commit, the same fenced change (claim, revision, answer) is one round
    trip: BEGIN, the fence, the claim, the revision, the answer and COMMIT; all of it lands,
    at the revision the store answered before sending it."""
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        store.fence(store.acquire_lease("a", "a:1", 30).epoch)
        with ExitStack() as traced, store.atomic(checked_at_commit=True):
            pinned = store.link.pinned()
            assert pinned is not None
            trips = traced.enter_context(round_trips(pinned))
            assert store.claim_answer("req-1", "SetContext", "fp")
            written = store.put_model(_model(), expect_revision=1)
            store.put_answer("req-1", "SetContext", b"answer", fingerprint="fp")
        assert written.revision == 2
        assert len(trips) == 1, trips
        assert trips[0].startswith("Query") and "FROM leases" in trips[0]
        assert trips[0].endswith('; COMMIT"')
        answer = store.get_answer("req-1")
        assert answer is not None and answer.answer == b"answer"
        assert [m.revision for m in store.model_history("m")] == [1, 2]


@pytest.mark.parametrize("broken", ["id taken", "revision moved", "lease moved"])
def test_a_check_that_fails_at_the_commit_keeps_nothing(dsn: str, broken: str) -> None:
    """When one of the checks sent with the COMMIT does not hold (the request id answered
    already, the model written past the revision expected, the lease another epoch's), the
    block raises ChecksFailed and nothing of it lands: no revision, no answer, no claim; the
    store is not taken for damaged."""
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        store.fence(store.acquire_lease("a", "a:1", 30).epoch)
        expect = 1
        if broken == "id taken":
            _change(store, "req-1", 1)
            expect = 2
        elif broken == "revision moved":
            store.put_model(_model(), expect_revision=1)
        else:
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("UPDATE leases SET epoch = epoch + 1, holder = 'b'")
        before = [(m.revision, m.spec) for m in store.model_history("m")]
        kept = store.get_answer("req-1")
        with pytest.raises(ChecksFailed):
            _change(store, "req-1", 1 if broken != "id taken" else expect)
        assert [(m.revision, m.spec) for m in store.model_history("m")] == before
        assert store.get_answer("req-1") == kept
        assert store.damage is None
        store.probe()


def test_a_failed_check_met_by_a_later_read_is_checks_failed_not_damage(dsn: str) -> None:
    """A read inside a block checked at its commit sends the checks queued before it: one
    that fails there raises ChecksFailed from the read (the block is rolled back), not
    StoreDamaged."""
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        store.put_model(_model(), expect_revision=1)
        with pytest.raises(ChecksFailed), store.atomic(checked_at_commit=True):
            store.put_model(_model(), expect_revision=1)  # stale: revision 2 is there
            store.get_answer("anything")
        assert store.damage is None
        assert [m.revision for m in store.model_history("m")] == [1, 2]
        assert _change(store, "req-2", 2).revision == 3
