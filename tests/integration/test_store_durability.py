"""Each store under kill -9 of its writer: nothing acknowledged is lost (and a SQLite file stays
sound)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_svc.store.urls import is_postgres, open_store
from tests.support.postgres import fresh_database
from tests.support.store_writer import answer_bytes

REPO_ROOT = Path(__file__).resolve().parents[2]
# Enough acknowledgements that every model, replica and value has been rewritten many times.
KILL_AFTER_ACKS = 400


def run_writer_and_kill(url: str) -> list[list[str]]:
    """Start the writer, SIGKILL it mid-stream, and return every line it acknowledged, split."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.store_writer", url],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # The child imports fleet_svc and tests from this checkout, whatever is installed.
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    lines: list[bytes] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready = proc.stdout.readline()
        assert ready == b"ready\n", proc.stderr.read().decode()
        while len(lines) < KILL_AFTER_ACKS:
            line = proc.stdout.readline()
            assert line.endswith(b"\n"), "the writer stopped before it was killed"
            lines.append(line)
        proc.send_signal(signal.SIGKILL)
        # Lines printed before the kill are still in the pipe. A cut-off last line was not a
        # complete acknowledgement, so it does not count.
        lines.extend(line + b"\n" for line in proc.stdout.read().split(b"\n")[:-1])
        assert proc.wait(timeout=20) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return [line.decode().split() for line in lines]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store: a file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "fleet.db")
    else:
        with fresh_database() as (_name, dsn):
            yield dsn


def test_acknowledged_writes_survive_sigkill(store_url: str) -> None:
    """Every write the child acknowledged before SIGKILL is in the reopened, sound database."""
    acks = run_writer_and_kill(store_url)
    assert len(acks) >= KILL_AFTER_ACKS

    last_revision: dict[str, int] = {}
    answers: list[str] = []
    last_restarts: dict[str, int] = {}
    last_round = -1
    for kind, *fields in acks:
        if kind == "model":
            last_revision[fields[0]] = int(fields[1])
        elif kind == "answer":
            answers.append(fields[0])
        elif kind == "replica":
            last_restarts[fields[0]] = int(fields[1])
        else:
            assert kind == "value", kind
            last_round = int(fields[1])
    assert last_revision and answers and last_restarts and last_round >= 0

    if not is_postgres(store_url):
        # Checked on a plain connection before the store opens (and checkpoints) the file.
        raw = sqlite3.connect(store_url)
        try:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            raw.close()

    store = open_store(store_url)
    try:
        # A write may commit after its last acknowledgement and before the kill, so the store
        # may be ahead of what was acknowledged, never behind.
        for name, revision in last_revision.items():
            history = [r.revision for r in store.model_history(name)]
            assert history[:revision] == list(range(1, revision + 1)), name
            current = store.get_model(name)
            assert current is not None and current.revision >= revision, name
        for request_id in answers:
            i = int(request_id.removeprefix("req-"))
            answered = store.get_answer(request_id)
            assert answered is not None, request_id
            assert (answered.method, answered.answer) == ("CreateModel", answer_bytes(i))
        replicas = {r.id: r for r in store.list_replicas()}
        for replica_id, restarts in last_restarts.items():
            stored = replicas[replica_id]
            assert stored.restarts >= restarts, replica_id
            # The row is whole: every field comes from the same write.
            assert stored.spec == {"round": stored.restarts}
            assert stored.gpus == (stored.restarts % 8,)
        stored_round = store.get_value("round")
        assert stored_round is not None and int(stored_round) >= last_round
    finally:
        store.close()
