"""`llmgw up`: the whole control plane on one machine, as a person starts it, and the example
catalog it loads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from llmgw.cli.up import CALLER, ensure_example_catalog, gpu_class_of, port_taken
from llmgw.common.v1 import common_pb2
from llmgw.demo.catalog import GGUF_MODEL, HF_MODEL, example_models
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from tests.support.fleet import running_fleet


def free_ports(n: int) -> list[int]:
    """`n` distinct ports nothing listens on now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def llmgw(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the `llmgw` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@contextlib.contextmanager
def lines_of(proc: subprocess.Popen[str]) -> Iterator[queue.Queue[str | None]]:
    """Its stdout's lines, read in a thread (None at the end)."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line.rstrip("\n"))
        q.put(None)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    yield q
    thread.join(timeout=5)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_runs_the_examples_ready_and_stops_every_child(tmp_path: Path) -> None:
    """`llmgw up` brings both example replicas to READY (shown by `llmgw ctl`), the vLLM
    example's stand-in answers a completion, the planner reads the demo's hf:// repo, and
    SIGTERM stops every process it started, engines included."""
    planner_port, fleet_port, files_port = free_ports(3)
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw.cli.main",
            "up",
            "--data",
            str(data),
            "--planner-port",
            str(planner_port),
            "--fleet-port",
            str(fleet_port),
            "--files-port",
            str(files_port),
            "--ready-timeout",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        with lines_of(proc) as lines:
            deadline = time.monotonic() + 75
            while True:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                assert line is not None, "llmgw up ended early:\n" + "\n".join(seen)
                seen.append(line)
                if line == "llmgw up: ready":
                    break
            fleet = f"127.0.0.1:{fleet_port}"
            listed = llmgw("ctl", "--fleet", fleet, "replica", "list", "--json")
            assert listed.returncode == 0, listed.stderr
            replicas = json.loads(listed.stdout)["replicas"]
            assert sorted((r["model"], r["phase"]) for r in replicas) == [
                (GGUF_MODEL, "REPLICA_PHASE_READY"),
                (HF_MODEL, "REPLICA_PHASE_READY"),
            ]
            vllm = next(r for r in replicas if r["model"] == HF_MODEL)
            answer = httpx.post(
                f"http://{vllm['address']}/v1/completions",
                json={"model": HF_MODEL, "prompt": "hello", "max_tokens": 4},
                timeout=10,
            )
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["text"]

            described = llmgw(
                "plan",
                "--planner",
                f"127.0.0.1:{planner_port}",
                "--json",
                "describe",
                "hf://llmgw-demo/tiny-llama",
            )
            assert described.returncode == 0, described.stderr
            assert json.loads(described.stdout)["shape"]["kvHeads"] == 8

            started = descendants(proc.pid)
            # files, planner, fleet, agent and the two engines.
            assert len(started) >= 6, started
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            rest = []
            while (line := lines.get(timeout=5)) is not None:
                rest.append(line)
        assert [line for line in rest if line.endswith("stopped (code 0)")] == [
            "llmgw up: agent stopped (code 0)",
            "llmgw up: fleet stopped (code 0)",
            "llmgw up: planner stopped (code 0)",
            "llmgw up: files stopped (code 0)",
        ]
        deadline = time.monotonic() + 10
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in started if alive(p)]
        for name in ("files", "planner", "fleet", "agent"):
            assert (data / "logs" / f"{name}.log").stat().st_size > 0
        assert (data / "fleet.db").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_taken_port_is_named_and_nothing_starts(tmp_path: Path) -> None:
    """With the fleet's port taken, `llmgw up` says which port and exits non-zero."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = int(holder.getsockname()[1])
        assert port_taken("127.0.0.1", taken)
        planner_port, files_port = free_ports(2)
        run = llmgw(
            "up",
            "--data",
            str(tmp_path / "data"),
            "--planner-port",
            str(planner_port),
            "--fleet-port",
            str(taken),
            "--files-port",
            str(files_port),
        )
    assert run.returncode != 0
    assert f"port {taken} (fleet)" in run.stderr
    assert "--fleet-port" in run.stderr
    assert not (tmp_path / "data" / "logs" / "planner.log").exists()


def test_bad_gpus_is_a_usage_error(tmp_path: Path) -> None:
    """A --gpus that is not COUNTxCLASS is refused with exit code 64 before anything starts."""
    run = llmgw("up", "--data", str(tmp_path / "data"), "--gpus", "lots")
    assert run.returncode == 64
    assert "--gpus 'lots'" in run.stderr
    assert gpu_class_of("8xH100-80GB,2xL4-24GB") == "H100-80GB"


async def test_example_catalog_is_created_once_and_left_to_its_editors(tmp_path: Path) -> None:
    """Loading the example catalog twice creates it once; a model `llmgw up` wrote last is
    brought up to date (a new file server port); one someone else changed is kept."""
    models = example_models(gguf_source="http://127.0.0.1:1/files/x.gguf", gpu_class="H100-80GB")
    async with running_fleet(tmp_path) as (fleet, _stub):
        with grpc.insecure_channel(f"127.0.0.1:{fleet.port}") as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)

            def load(ms: list[common_pb2.Model]) -> list[str]:
                return ensure_example_catalog(stub, ms)

            assert await asyncio.to_thread(load, models) == [
                f"created {GGUF_MODEL}",
                f"created {HF_MODEL}",
            ]
            again = await asyncio.to_thread(load, models)
            assert again == [
                f"kept {GGUF_MODEL} (revision 1, by {CALLER})",
                f"kept {HF_MODEL} (revision 1, by {CALLER})",
            ]
            moved = example_models(
                gguf_source="http://127.0.0.1:2/files/x.gguf", gpu_class="H100-80GB"
            )
            edited = fleet_pb2.UpdateModelRequest(model=moved[1], etag="1")
            edited.model.context_length = 4096
            await asyncio.to_thread(stub.UpdateModel, edited, metadata=(("x-llmgw-caller", "ops"),))
            assert await asyncio.to_thread(load, moved) == [
                f"updated {GGUF_MODEL} (its example settings changed)",
                f"kept {HF_MODEL} (revision 2, by ops)",
            ]
            got = await asyncio.to_thread(stub.GetModel, fleet_pb2.GetModelRequest(name=GGUF_MODEL))
            assert got.model.model.source == "http://127.0.0.1:2/files/x.gguf"
