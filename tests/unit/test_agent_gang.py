"""A gang member's command line on its node: the engine's launch flags after the profile's,
the worker program for llama.cpp's RPC ranks, and refusals for what cannot start."""

from __future__ import annotations

import sys

import pytest

from fleet_svc.agent.config import STANDIN_MODULE, ConfigError, standin_engine
from fleet_svc.agent.config_file import parse_engine
from fleet_svc.agent.gang import GangRefused, MemberCommand, member_command, serves_http
from fleet_svc.agent.replica import ReplicaSpec
from fleet_svc.standin.gang import GangError, GangRole, parse_rpc_server, read_role
from llmgw.engines.gang import MemberOrder

PY = sys.executable


def spec(engine: str, rank: int, peers: tuple[str, ...], args: tuple[str, ...] = ()) -> ReplicaSpec:
    """Replica g's member of rank `rank` in a gang of two."""
    return ReplicaSpec(
        "g", 1, engine, model="big", args=args, gpus=(0, 1), gang=MemberOrder(rank, 2, peers)
    )


def command(s: ReplicaSpec) -> MemberCommand:
    """The member's command on 127.0.0.1:8000, a gang port of 29600 when it listens."""
    return member_command(standin_engine(s.engine), s, "127.0.0.1", 8000, "10.0.0.2", lambda: 29600)


STANDIN = [PY, "-m", STANDIN_MODULE, "--host", "127.0.0.1", "--port", "8000", "--model", "big"]


@pytest.mark.parametrize(
    ("s", "argv", "gang_port", "http"),
    [
        (
            spec("vllm", 0, ("", ""), ("-tp", "2")),
            [
                *STANDIN,
                "--engine",
                "vllm",
                "-tp",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--master-addr",
                "10.0.0.2",
                "--master-port",
                "29600",
            ],
            29600,
            True,
        ),
        (
            spec("vllm", 1, ("10.0.0.1:29501", "")),
            [
                *STANDIN,
                "--engine",
                "vllm",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--master-addr",
                "10.0.0.1",
                "--master-port",
                "29501",
                "--headless",
            ],
            0,
            False,
        ),
        (
            spec("sglang", 1, ("10.0.0.1:29501", "")),
            [
                *STANDIN,
                "--engine",
                "sglang",
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--dist-init-addr",
                "10.0.0.1:29501",
            ],
            0,
            True,
        ),
        (
            spec("llamacpp", 1, ("", "")),
            [PY, "-m", STANDIN_MODULE, "--rpc-server", "-H", "10.0.0.2", "-p", "29600"],
            29600,
            False,
        ),
        (
            spec("llamacpp", 0, ("", "10.0.0.3:50052"), ("--ctx-size", "4096")),
            [*STANDIN, "--engine", "llamacpp", "--ctx-size", "4096", "--rpc", "10.0.0.3:50052"],
            0,
            True,
        ),
    ],
)
def test_each_member_runs_its_engines_launch(
    s: ReplicaSpec, argv: list[str], gang_port: int, http: bool
) -> None:
    """The profile's arguments, then the rank's own flags; a worker runs the worker program."""
    got = command(s)
    assert got == MemberCommand(argv, gang_port, http)
    assert serves_http(standin_engine(s.engine), s) is http


@pytest.mark.parametrize(
    ("s", "words"),
    [
        (spec("vllm", 1, ("", "")), "needs the gang addresses of ranks [0]"),
        (spec("llamacpp", 0, ("", "")), "needs the gang addresses of ranks [1]"),
        (spec("vllm", 1, ("--trust-remote-code:1", "")), "is not HOST:PORT"),
        (spec("vllm", 1, ("10.0.0.1:99999", "")), "is not HOST:PORT"),
        (spec("vllm", 1, ("a:1", "b:2", "c:3")), "3 peer addresses for a gang of 2 nodes"),
        (spec("trtllm", 0, ("", "")), "no multi-node launch"),
        (
            ReplicaSpec("g", 1, "vllm", gang=MemberOrder(rank=2, nnodes=2)),
            "rank 2 of 2 nodes is not a gang member",
        ),
    ],
)
def test_a_member_that_cannot_start_is_refused_with_why(s: ReplicaSpec, words: str) -> None:
    """A missing or malformed peer, a rank outside the gang, an engine with no launch."""
    with pytest.raises(GangRefused) as err:
        command(s)
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("engine", "argv", "gpus", "role"),
    [
        ("vllm", ["-tp", "2"], 2, None),
        (
            "vllm",
            [
                "-tp",
                "2",
                "-pp",
                "2",
                "-n",
                "2",
                "-r",
                "1",
                "--master-addr",
                "h",
                "--master-port",
                "9",
                "--headless",
            ],
            2,
            GangRole("vllm", 2, 1, ("h", 9), serves_http=False),
        ),
        (
            "sglang",
            ["--tp-size", "4", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "h:9"],
            2,
            GangRole("sglang", 2, 0, ("h", 9)),
        ),
        ("llamacpp", ["--rpc", "a:1,b:2"], 1, GangRole("llamacpp", 3, 0, rpc=(("a", 1), ("b", 2)))),
    ],
)
def test_the_standin_reads_the_gang_flags_as_its_engine(
    engine: str, argv: list[str], gpus: int, role: GangRole | None
) -> None:
    """vLLM's short aliases, SGLang's dist-init address, llama.cpp's RPC list."""
    assert read_role(engine, argv, gpus, {}) == role


@pytest.mark.parametrize(
    ("engine", "argv", "gpus", "words"),
    [
        ("vllm", ["--nnodes", "2", "--node-rank", "2", "--headless"], 1, "must be in [0, nnodes)"),
        ("vllm", ["-tp", "2", "--nnodes", "2", "--node-rank", "1"], 1, "must run --headless"),
        ("vllm", ["-tp", "2", "--nnodes", "2", "--node-rank", "0"], 2, "world size 2"),
        ("vllm", ["--nnodes", "x"], 1, "invalid int value"),
        (
            "sglang",
            ["--tp-size", "2", "--nnodes", "2", "--node-rank", "1"],
            1,
            "--dist-init-addr is required",
        ),
        (
            "sglang",
            ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "nohost"],
            1,
            "not HOST:PORT",
        ),
        (
            "sglang",
            ["--nnodes", "2", "--node-rank", "-1", "--dist-init-addr", "h:1"],
            1,
            "not below nnodes",
        ),
        ("llamacpp", ["--rpc", ""], 1, "no RPC servers"),
    ],
)
def test_the_standin_refuses_what_its_engine_would(
    engine: str, argv: list[str], gpus: int, words: str
) -> None:
    """A rank outside the gang, a rank > 0 not headless, a world that is not nodes x cards."""
    with pytest.raises(GangError) as err:
        read_role(engine, argv, gpus, {})
    assert words in str(err.value)


def test_rpc_server_takes_its_host_and_port_flags() -> None:
    """`-H HOST -p PORT`, rpc-server's defaults otherwise."""
    assert parse_rpc_server(["-H", "10.0.0.2", "-p", "50060"]) == ("10.0.0.2", 50060)
    assert parse_rpc_server([]) == ("127.0.0.1", 50052)


def test_the_worker_program_comes_from_the_config() -> None:
    """`worker_executable` names llama.cpp's rpc-server (found on PATH once, or absolute); a
    name not on PATH is refused, and a llama.cpp engine without one runs no worker rank."""
    which = {"rpc-server": "/usr/bin/rpc-server"}.get
    base = {"executable": "/opt/llama-server", "family": "llamacpp"}
    engine = parse_engine("llamacpp", {**base, "worker_executable": "rpc-server"}, which)
    assert engine.worker_program == ("/usr/bin/rpc-server",)
    with pytest.raises(ConfigError, match="worker_executable 'rpc-srv' is not on PATH"):
        parse_engine("llamacpp", {**base, "worker_executable": "rpc-srv"}, which)
    bare = parse_engine("llamacpp", base, which)
    with pytest.raises(GangRefused, match="names none \\(worker_executable\\)"):
        member_command(bare, spec("llamacpp", 1, ("", "")), "127.0.0.1", 1, "h", lambda: 2)
