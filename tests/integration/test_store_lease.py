"""Leadership among fleets on one PostgreSQL: the lease, its fencing epoch, and a leader paused
past its lease that writes nothing once resumed (real processes, SIGSTOP and SIGCONT)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from fleet_svc.store.base import NotLeader, ReplicaRecord, RolloutRecord
from fleet_svc.store.postgres import PostgresStore
from tests.support.postgres import fresh_database

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dsn() -> Iterator[str]:
    """A fresh database's DSN."""
    with fresh_database() as (_name, made):
        yield made


def test_one_holder_at_a_time_and_a_new_epoch_at_each_change(dsn: str) -> None:
    """A takes the lease (epoch 1) and renews it keeping its epoch; B is told A holds it; once
    A's lease runs out B takes it at epoch 2, and A is then told B holds it."""
    with PostgresStore(dsn) as a, PostgresStore(dsn) as b:
        first = a.acquire_lease("a", "a:1", 0.6)
        assert (first.mine, first.epoch) == (True, 1)
        assert a.acquire_lease("a", "a:1", 0.6).epoch == 1
        seen = b.acquire_lease("b", "b:1", 0.6)
        assert (seen.mine, seen.holder, seen.address, seen.epoch) == (False, "a", "a:1", 1)
        time.sleep(0.8)
        taken = b.acquire_lease("b", "b:1", 5)
        assert (taken.mine, taken.epoch) == (True, 2)
        after = a.acquire_lease("a", "a:1", 5)
        assert (after.mine, after.holder, after.epoch) == (False, "b", 2)


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_write_fenced_with_an_old_epoch_is_refused_and_not_made(
    dsn: str, pipelined: bool
) -> None:
    """Once B took over, A's writes fenced with epoch 1 are refused naming B and its address,
    and none lands; B's writes with epoch 2 are made; unfenced writes are not checked (with
    A's statements sent one at a time or pipelined)."""
    with PostgresStore(dsn) as a, PostgresStore(dsn) as b:
        a.pipelining = pipelined
        a.fence(a.acquire_lease("a", "a:1", 0.3).epoch)
        a.put_value("by", "a")
        time.sleep(0.5)
        b.fence(b.acquire_lease("b", "10.0.0.2:50052", 5).epoch)
        writes: list[Callable[[], None]] = [
            lambda: a.put_value("by", "a-late"),
            lambda: a.put_answer("req-late", "CreateModel", b"x"),
            lambda: a.write_replicas([], ["r-1"]),
            lambda: a.delete_replica("r-1"),
            lambda: _claimed_in_a_block(a, "req-claimed"),
            lambda: _answered_in_a_block(a, "req-answered"),
        ]
        for write in writes:
            with pytest.raises(NotLeader) as refused:
                write()
            assert (refused.value.epoch, refused.value.leader_epoch) == (1, 2)
            assert refused.value.leader_address == "10.0.0.2:50052"
        assert b.get_value("by") == "a" and b.get_answer("req-late") is None
        assert b.get_answer("req-claimed") is None and b.get_answer("req-answered") is None
        b.put_value("by", "b")
        a.fence(None)
        a.put_value("unfenced", "yes")
        assert b.get_value("by") == "b" and b.get_value("unfenced") == "yes"


def _claimed_in_a_block(store: PostgresStore, request_id: str) -> None:
    """A request id claimed and answered in one atomic block (the fence is read with the
    claim's answer)."""
    with store.atomic():
        store.claim_answer(request_id, "CreateModel", "fp")
        store.put_answer(request_id, "CreateModel", b"x", fingerprint="fp")


def _answered_in_a_block(store: PostgresStore, request_id: str) -> None:
    """An atomic block whose one write reads no answer (the fence is read before COMMIT)."""
    with store.atomic():
        store.put_answer(request_id, "CreateModel", b"x")


def test_a_takeover_waits_for_a_fenced_write_in_flight(dsn: str) -> None:
    """A fenced write that passed its check holds the lease row: a taker's renewal-after-expiry
    waits for it to commit, so the write lands before the new epoch, never after it."""
    with PostgresStore(dsn) as a:
        epoch = a.acquire_lease("a", "a:1", 0.2).epoch
        time.sleep(0.4)
        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SELECT epoch FROM leases WHERE name = 'fleet' FOR SHARE")
                assert epoch == 1
                taker: dict[str, object] = {}

                def take() -> None:
                    with PostgresStore(dsn) as b:
                        taker["lease"] = b.acquire_lease("b", "b:1", 5)
                        taker["at"] = time.monotonic()

                thread = threading.Thread(target=take)
                thread.start()
                time.sleep(0.5)
                assert "lease" not in taker, "the takeover did not wait for the share lock"
                conn.execute("INSERT INTO named_values VALUES ('in-flight', 'a')")
                released = time.monotonic()
            thread.join(timeout=20)
        assert taker["at"] >= released  # type: ignore[operator]


def _start_writer(dsn: str, holder: str, lease_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lease_writer", dsn, holder, str(lease_s)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def _answers_by(dsn: str, holder: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT request_id FROM answers WHERE request_id LIKE %s", (holder + "-%",)
        ).fetchall()
    return {str(r[0]) for r in rows}


def _wait(predicate: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_leader_paused_past_its_lease_writes_nothing_once_resumed(dsn: str) -> None:
    """A leads and writes; SIGSTOP holds it past its lease; B takes over (a new epoch) and
    writes; SIGCONT resumes A, still believing it leads: its next write is refused by the fence,
    it writes nothing more — every row of A's was made before it was paused — and follows B."""
    lease_s = 1.0
    a = _start_writer(dsn, "a", lease_s)
    b: subprocess.Popen[str] | None = None
    try:
        _wait(lambda: len(_answers_by(dsn, "a")) >= 5, 20, "A never led")
        a.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # a commit in flight at the stop has landed by now
        by_a_when_paused = _answers_by(dsn, "a")
        b = _start_writer(dsn, "b", lease_s)
        _wait(lambda: len(_answers_by(dsn, "b")) >= 5, 20, "B never took over")
        assert {k.split("-")[1] for k in _answers_by(dsn, "b")} == {"2"}
        a.send_signal(signal.SIGCONT)
        time.sleep(2.0)
        assert _answers_by(dsn, "a") == by_a_when_paused, "A wrote after B took over"
        assert {k.split("-")[1] for k in by_a_when_paused} == {"1"}
        b_before = len(_answers_by(dsn, "b"))
        _wait(lambda: len(_answers_by(dsn, "b")) > b_before + 5, 10, "B stopped writing")
    finally:
        for proc in (a, b):
            if proc is None:
                continue
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            out, _ = proc.communicate(timeout=10)
            if proc is a:
                a_out = out
    resumed = a_out.split("fenced 1", 1)
    assert len(resumed) == 2, "A's writes after the pause never met the fence: " + a_out[-2000:]
    assert "follower 2 b" in resumed[1] and "wrote" not in resumed[1], resumed[1][:2000]


def test_the_state_digest_moves_with_every_replica_and_rollout_write_and_only_then(
    dsn: str,
) -> None:
    """What followers poll: the same while nothing is written (the lease renewed, values put),
    different after a replica changes phase or address, is deleted, or a rollout is saved."""
    with PostgresStore(dsn) as store:
        empty = store.state_digest()
        r = ReplicaRecord("r-1", "m", "p", 1, node="n1", gpus=(0,), phase="STARTING")
        store.put_replica(r)
        seen = {empty, store.state_digest()}
        store.acquire_lease("a", "a:1", 5)
        store.put_value("desired_version", "3")
        assert store.state_digest() in seen and len(seen) == 2
        changes: list[Callable[[], None]] = [
            lambda: store.put_replica(replace(r, phase="READY")),
            lambda: store.put_replica(replace(r, phase="READY", address="10.0.0.1:8000")),
            lambda: store.put_rollout(RolloutRecord("ro-1", "m", "RUNNING", {}, 1.0, 1.0)),
            lambda: store.put_rollout(RolloutRecord("ro-1", "m", "SUCCEEDED", {}, 1.0, 2.0)),
            lambda: store.delete_replica("r-1"),
        ]
        for change in changes:
            change()
            now = store.state_digest()
            assert now not in seen
            seen.add(now)
