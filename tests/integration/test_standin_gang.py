"""The stand-in as gang members, real processes over real sockets: a head that serves only
once every rank joined, members that fail when the head refuses them or goes away, and
llama.cpp's head failing on an RPC server it cannot reach."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from fleet_svc.agent.host import free_port
from tests.integration.test_standin import standin, standin_env, wait_status

VLLM = ["--engine", "vllm", "--load-s", "0.1", "-tp", "2", "-pp", "2"]


def vllm_rank(rank: int, master: int, nnodes: int = 2) -> list[str]:
    """vLLM's multi-node flags for `rank` meeting at 127.0.0.1:`master`."""
    flags = [*VLLM, "--nnodes", str(nnodes), "--node-rank", str(rank)]
    flags += ["--master-addr", "127.0.0.1", "--master-port", str(master)]
    return flags + (["--headless"] if rank else [])


def output_of(proc: subprocess.Popen[str]) -> str:
    """Wait for the process to exit; its output."""
    out, _ = proc.communicate(timeout=30)
    return out


def test_the_head_serves_once_its_member_joined_and_fails_when_it_leaves() -> None:
    """503 until rank 1 joins, 200 after; killing rank 1 takes the head down with a reason."""
    master = free_port("127.0.0.1")
    env = standin_env("0,1")
    with standin(vllm_rank(0, master), env) as (head, url):
        assert wait_status(f"{url}/health", 503)[-1] == 503
        with standin(vllm_rank(1, master), env) as (member, member_url):
            assert wait_status(f"{url}/health", 200)[-1] == 200
            # A headless member serves no HTTP at all.
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{member_url}/health", timeout=1.0, trust_env=False)
            member.kill()
        out = output_of(head)
        assert head.returncode == 1 and "rank 1 went away" in out


def test_a_member_counting_other_nodes_is_refused_by_the_head() -> None:
    """A rank that says the gang has three nodes cannot join a head of two."""
    master = free_port("127.0.0.1")
    env = standin_env("0,1")
    wide = vllm_rank(1, master, nnodes=3)
    wide[wide.index("-pp") + 1] = "3"
    with standin(vllm_rank(0, master), env), standin(wide, standin_env("0,1")) as (member, _):
        out = output_of(member)
        assert member.returncode == 1
        assert "refused rank 1: it counts 3 nodes, the head 2" in out


def test_a_member_with_no_head_to_reach_fails() -> None:
    """No head listens on the rendezvous: the member gives up after its timeout."""
    master = free_port("127.0.0.1")
    env = standin_env("0,1", LLMGW_STANDIN_GANG_TIMEOUT_S="0.5")
    with standin(vllm_rank(1, master), env) as (member, _):
        out = output_of(member)
        assert (
            member.returncode == 1 and f"could not reach the head node at 127.0.0.1:{master}" in out
        )


def test_llamacpp_head_needs_its_rpc_server() -> None:
    """With an rpc-server listening the head serves; with none it fails naming the address."""
    rpc_port = free_port("127.0.0.1")
    env = standin_env("0")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_svc.standin",
            "--rpc-server",
            "-H",
            "127.0.0.1",
            "-p",
            str(rpc_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        args = ["--engine", "llamacpp", "--load-s", "0.1", "--rpc", f"127.0.0.1:{rpc_port}"]
        with standin(args, env) as (_head, url):
            assert wait_status(f"{url}/health", 200)[-1] == 200
    finally:
        worker.terminate()
        worker.communicate(timeout=30)
    assert worker.returncode == 0
    gone = free_port("127.0.0.1")
    args = ["--engine", "llamacpp", "--load-s", "0", "--rpc", f"127.0.0.1:{gone}"]
    with standin(args, standin_env("0", LLMGW_STANDIN_GANG_TIMEOUT_S="0.5")) as (head, _):
        out = output_of(head)
        assert (
            head.returncode == 1 and f"failed to connect to RPC server at 127.0.0.1:{gone}" in out
        )
