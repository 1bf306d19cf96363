"""A starting replica's download progress, end to end: a real agent (a child process) fetching
a GGUF from a real HTTP server that sends it slowly, reporting at most once a second; and the
same through a real fleet to ListReplicas, `llmgw ctl replica list` and `replica watch`,
rising, then LOADING, then READY with no progress left."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_svc.domain.nodes import Liveness
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.content import SparseFile
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet
from llmgw.testing.http import Exchange, Listener
from tests.integration.test_agent_fetch import CONFIG, GGUF
from tests.integration.test_agent_process import HEALTHY, agent_process, stop_agent
from tests.integration.test_cli_ctl import _env
from tests.support.fleet import running_fleet

pytestmark = pytest.mark.slow

DOWNLOADING = common_pb2.START_STAGE_DOWNLOADING
LOADING = common_pb2.START_STAGE_LOADING
PATIENT = Liveness(interval_s=0.5, grace_heartbeats=10, lost_after_s=60.0)
"""Heartbeats the agent child and the CLI's Python starts on 2 shared cores cannot miss."""


def slow_server(size_bytes: int, bytes_per_s: float) -> Listener:
    """An HTTP server answering every GET with a GGUF of `size_bytes` at `bytes_per_s`."""
    body = SparseFile(GGUF[:64], size_bytes)

    def route(ex: Exchange) -> None:
        ex.send_body(body, {}, pace_bytes_per_s=bytes_per_s)

    return Listener(route, name="slow")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The agent's config: llama.cpp stood in for, loading for 1.5 s once started."""
    path = tmp_path / "agent.yaml"
    path.write_text(CONFIG.format(argv=tmp_path / "argv"))
    return path


@pytest.fixture
def slow() -> Iterator[Listener]:
    """32 MB at 8 MB/s: about 4 s, in 1 MiB chunks (the agent's read size), 30 and more."""
    server = slow_server(32_000_000, 8_000_000).start()
    yield server
    server.stop()


async def test_the_agent_reports_a_slow_download_rising_once_a_second_then_loading(
    slow: Listener, config: Path, tmp_path: Path
) -> None:
    """The agent's reports while it fetches: bytes rising to the whole file, the total and a
    rate told, no more than one a second (the fetch reads 30 chunks and more), then LOADING
    once the engine runs, and no progress once HEALTHY."""
    spec = agent_pb2.ReplicaSpec(
        replica_id="r-slow",
        revision=1,
        model="tiny",
        profile="cpu",
        engine="llamacpp",
        args=["--load-s", "1.5", "-c", "4096"],
        source=f"{slow.url}/tiny.gguf",
    )
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", config=config) as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        began = time.monotonic()
        fleet.desire(spec)
        await assert_eventually(
            lambda: HEALTHY in fleet.phases_of("r-slow"), timeout_s=60, what="HEALTHY"
        )
        took_s = time.monotonic() - began
        updates = fleet.updates_of("r-slow")
        await stop_agent(proc)
    fetching = [u.progress for u in updates if u.progress.stage == DOWNLOADING]
    done = [p.done_bytes for p in fetching]
    assert done == sorted(done) and done[-1] == 32_000_000
    assert len(set(done)) >= 3, f"progress did not rise in steps: {done}"
    assert {p.total_bytes for p in fetching if p.done_bytes} == {32_000_000}
    assert any(p.rate_bytes_per_s > 0 for p in fetching)
    assert fetching[-1].files_done == 1 and fetching[-1].file == "tiny.gguf"
    # The first (fetching starts), one a second, the last: never one per chunk.
    assert len(fetching) <= took_s + 3, f"{len(fetching)} reports in {took_s:.1f} s"
    stages = [u.progress.stage for u in updates if u.HasField("progress")]
    assert LOADING in stages and stages.index(LOADING) > stages.index(DOWNLOADING)
    healthy = [u for u in updates if u.phase == HEALTHY]
    assert not healthy[0].HasField("progress")


CPU_GGUF = common_pb2.Model(
    name="tiny",
    context_length=4096,
    profiles=[
        common_pb2.Profile(
            name="cpu",
            engine="llamacpp",
            args=["--load-s", "1.5", "-c", "4096"],
            cpu_only=True,
            min_memory_gb=1,
            replicas=1,
        )
    ],
)


async def test_replica_list_and_watch_show_the_download_rising_then_ready(
    config: Path, tmp_path: Path
) -> None:
    """Through a real fleet: ListReplicas shows DOWNLOADING bytes rising, then LOADING, then
    READY with no progress; `replica list` has it in its PROGRESS column (and in -o json), and
    `replica watch` prints PROGRESS lines before the endpoint's ADDED."""
    with slow_server(24_000_000, 3_000_000) as slow:
        async with running_fleet(tmp_path, liveness=PATIENT) as (fleet, stub):
            watch = await _cli(fleet.port, "replica", "watch")
            async with agent_process(fleet.port, tmp_path / "state", config=config) as agent:
                model = common_pb2.Model()
                model.CopyFrom(CPU_GGUF)
                model.source = f"{slow.url}/tiny.gguf"
                await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
                seen: list[fleet_pb2.Replica] = []
                table = as_json = None
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                    if rs:
                        seen.append(rs[0])
                        if rs[0].phase == fleet_pb2.REPLICA_PHASE_READY:
                            break
                        downloading = rs[0].progress.stage == DOWNLOADING
                        if table is None and downloading and rs[0].progress.done_bytes:
                            table = asyncio.create_task(_ctl(fleet.port, "replica", "list"))
                            as_json = asyncio.create_task(
                                _ctl(fleet.port, "replica", "list", "-o", "json")
                            )
                    await asyncio.sleep(0.2)
                assert seen and seen[-1].phase == fleet_pb2.REPLICA_PHASE_READY
                assert table is not None and as_json is not None
                listed, listed_json = await table, await as_json
                watched = await _lines_until(watch, "ADDED")
                await stop_agent(agent)
    done = [r.progress.done_bytes for r in seen if r.progress.stage == DOWNLOADING]
    assert done == sorted(done) and len(set(done)) >= 3, done
    assert any(r.progress.stage == LOADING for r in seen)
    assert not seen[-1].HasField("progress")
    header, row = listed.splitlines()[:2]
    column = header.index("PROGRESS")
    assert row[column:].startswith("downloading ") and "/24 MB" in row, listed
    (shown,) = json.loads(listed_json)["replicas"]
    assert shown["progress"]["stage"] == "START_STAGE_DOWNLOADING"
    assert shown["progress"]["total_bytes"] == "24000000"
    progress = [line for line in watched if line.startswith("PROGRESS tiny/cpu ")]
    assert any("downloading" in line for line in progress), watched
    assert watched[-1].startswith("ADDED") and watched.index(progress[0]) < len(watched) - 1


async def _cli(port: int, *args: str) -> asyncio.subprocess.Process:
    """`llmgw ctl --fleet 127.0.0.1:PORT ARGS...` started, its stdout piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.cli.main",
        "ctl",
        "--fleet",
        f"127.0.0.1:{port}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        env=_env(),
    )


async def _ctl(port: int, *args: str) -> str:
    """What one `llmgw ctl` run printed (it must succeed)."""
    proc = await _cli(port, *args)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return out.decode()


async def _lines_until(proc: asyncio.subprocess.Process, kind: str) -> list[str]:
    """A watch's lines up to the first that starts with `kind`; the watch is then ended."""
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith(kind):
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, f"the watch ended before {kind}: {lines}"
            lines.append(line.decode().rstrip("\n"))
    finally:
        proc.terminate()
        await proc.wait()
    return lines


async def test_an_engines_own_hub_download_shows_from_its_cache_then_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that pulls an hf:// repo itself (vLLM, stood in for): while a blob of the
    repo in its Hub cache ($HF_HOME/hub) is `.incomplete`, the agent reports DOWNLOADING with
    the bytes on disk growing and the whole files counted; once every blob is whole, LOADING;
    once healthy, nothing."""
    blobs = tmp_path / "hf" / "hub" / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "config").write_bytes(bytes(1000))
    partial = blobs / "weights.incomplete"
    partial.write_bytes(bytes(500))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = agent_pb2.ReplicaSpec(
        replica_id="r-hf",
        revision=1,
        model="tiny",
        profile="gpu",
        engine="vllm",
        args=["--load-s", "12"],  # long enough for the steps below on a loaded machine
        gpus=[0],
        source="hf://org/tiny",
    )

    def reported(done_bytes: int, stage: int = DOWNLOADING) -> agent_pb2.ObservedReplica | None:
        return next(
            (
                u
                for u in fleet.updates_of("r-hf")
                if u.progress.stage == stage and u.progress.done_bytes == done_bytes
            ),
            None,
        )

    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", "--demo") as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        fleet.desire(spec)
        first = await assert_eventually(lambda: reported(1500), timeout_s=20, what="1500 B")
        assert first.progress.files_done == 1 and first.progress.file == "org/tiny"
        assert first.progress.total_bytes == 0  # the engine asks the Hub; the agent cannot tell
        partial.write_bytes(bytes(2500))
        await assert_eventually(lambda: reported(3500), timeout_s=20, what="3500 B")
        partial.rename(blobs / "weights")
        await assert_eventually(lambda: reported(3500, LOADING), timeout_s=20, what="LOADING")
        await assert_eventually(
            lambda: HEALTHY in fleet.phases_of("r-hf"), timeout_s=30, what="HEALTHY"
        )
        healthy = [u for u in fleet.updates_of("r-hf") if u.phase == HEALTHY]
        assert not healthy[0].HasField("progress")
        await stop_agent(proc)
