"""Each engine's own multi-node launch: the flags every rank gets, who listens, who waits for
whom, and the engines that refuse to span nodes."""

from __future__ import annotations

import pytest

from fleet_svc.agent.admission import ArgRules, refused_arg
from llmgw.engines import registry
from llmgw.engines.gang import EngineSingleNode, GangLaunch, GangMember

PEERS = ("10.0.0.1:29501", "10.0.0.2:50052", "10.0.0.3:50053")


@pytest.mark.parametrize(
    ("engine", "rank", "launch"),
    [
        # vLLM >= 0.11 (vllm/engine/arg_utils.py, vllm/entrypoints/cli/serve.py run_headless).
        (
            "vllm",
            0,
            GangLaunch(
                args=(
                    "--nnodes",
                    "3",
                    "--node-rank",
                    "0",
                    "--master-addr",
                    "10.0.0.1",
                    "--master-port",
                    "29501",
                ),
                listens=True,
            ),
        ),
        (
            "vllm",
            2,
            GangLaunch(
                args=(
                    "--nnodes",
                    "3",
                    "--node-rank",
                    "2",
                    "--master-addr",
                    "10.0.0.1",
                    "--master-port",
                    "29501",
                    "--headless",
                ),
                needs=(0,),
                serves_http=False,
            ),
        ),
        # SGLang (sglang/srt/server_args.py): ranks >= 1 answer a dummy /health.
        (
            "sglang",
            0,
            GangLaunch(
                args=("--nnodes", "3", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:29501"),
                listens=True,
            ),
        ),
        (
            "sglang",
            1,
            GangLaunch(
                args=("--nnodes", "3", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:29501"),
                needs=(0,),
            ),
        ),
        # llama.cpp: the head lists the RPC workers; a worker runs rpc-server -H -p.
        (
            "llamacpp",
            0,
            GangLaunch(args=("--rpc", "10.0.0.2:50052,10.0.0.3:50053"), needs=(1, 2)),
        ),
        (
            "llama.cpp",
            1,
            GangLaunch(
                args=("-H", "10.0.0.2", "-p", "50052"), worker=True, listens=True, serves_http=False
            ),
        ),
    ],
)
def test_each_rank_gets_its_engines_own_launch_flags(
    engine: str, rank: int, launch: GangLaunch
) -> None:
    """The rank's flags, role and wait order are the engine's own multi-node launch."""
    host, _, port = PEERS[rank].rpartition(":")
    member = GangMember(rank=rank, nnodes=3, host=host, port=int(port), peers=PEERS)
    assert registry.get(engine).gang_launch(("--max-model-len", "4096"), member) == launch


@pytest.mark.parametrize("engine", ["trtllm", "tei", "infinity"])
def test_engines_without_a_multi_node_launch_refuse_a_gang(engine: str) -> None:
    """TensorRT-LLM (mpirun-launched) and one-card servers say they cannot span nodes."""
    with pytest.raises(EngineSingleNode) as err:
        registry.get(engine).gang_launch((), GangMember(rank=0, nnodes=2))
    assert err.value.metadata() == {"engine": registry.get(engine).name, "nodes": "2"}


@pytest.mark.parametrize(("rank", "nnodes"), [(2, 2), (-1, 2), (0, 1), (0, 65)])
def test_a_rank_outside_its_gang_is_refused(rank: int, nnodes: int) -> None:
    """No engine is started as rank 2 of 2, rank -1, a gang of one or of 65 nodes."""
    for engine in ("vllm", "sglang", "llamacpp"):
        with pytest.raises(EngineSingleNode):
            registry.get(engine).gang_launch((), GangMember(rank=rank, nnodes=nnodes))


def test_a_profile_cannot_set_the_launch_flags_itself() -> None:
    """The agent refuses gang flags in a profile's arguments: it writes them itself."""
    for family, args in (
        ("vllm", ["--nnodes", "2"]),
        ("vllm", ["--headless"]),
        ("sglang", ["--dist-init-addr", "x:1"]),
        ("llamacpp", ["--rpc", "x:1"]),
    ):
        why = refused_arg(args, ArgRules(family))
        assert why is not None and "refused" in why
