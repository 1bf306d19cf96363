"""Nothing the fleet accepted is lost when it is killed with SIGKILL and started again, on
either store (a SQLite file, or a fresh PostgreSQL database on the test server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from tests.support.postgres import fresh_database

T = TypeVar("T")


@contextmanager
def fleet_process(store: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`python -m fleet_svc` on a free port with its store at `store`; its process and port."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_svc",
            "--listen",
            "127.0.0.1:0",
            "--store",
            store,
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fleet listening on"), line
        yield proc, int(line.rsplit(":", 1)[1])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def model(i: int) -> common_pb2.Model:
    """A small catalog model."""
    return common_pb2.Model(
        name=f"m{i}",
        source=f"hf://org/m{i}",
        profiles=[common_pb2.Profile(name="p", engine="vllm", gpu_class="H100-80GB", replicas=0)],
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where the fleet keeps its state: a file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "fleet.db")
    else:
        with fresh_database() as (_name, dsn):
            yield dsn


def test_kill_9_loses_nothing_accepted(store_url: str) -> None:
    """Models created and answered before a SIGKILL are all there after a restart, and a retry
    of an answered request id returns its first answer."""
    answers = {}
    with fleet_process(store_url) as (proc, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            for i in range(20):
                answer = stub.CreateModel(
                    fleet_pb2.CreateModelRequest(model=model(i), request_id=f"req-{i}"),
                    timeout=10,
                )
                answers[f"req-{i}"] = answer
            changed = model(0)
            changed.max_output = 512
            stub.UpdateModel(
                fleet_pb2.UpdateModelRequest(
                    model=changed, etag=answers["req-0"].model.etag, request_id="upd"
                ),
                timeout=10,
            )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    with fleet_process(store_url) as (_proc, port):  # noqa: SIM117 (the port comes from it)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            listed = stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=10).models
            assert sorted(m.model.name for m in listed) == sorted(f"m{i}" for i in range(20))
            m0 = stub.GetModel(fleet_pb2.GetModelRequest(name="m0"), timeout=10).model
            assert m0.revision == 2
            again = leader_call(
                lambda: stub.CreateModel(
                    fleet_pb2.CreateModelRequest(model=model(7), request_id="req-7"), timeout=10
                )
            )
            assert again == answers["req-7"]


def leader_call(fn: Callable[[], T]) -> T:
    """`fn()` once the fleet leads: on PostgreSQL a restarted fleet waits out the lease its
    killed predecessor held (a few seconds) and answers NOT_LEADER meanwhile."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.2)
