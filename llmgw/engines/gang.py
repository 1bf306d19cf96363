"""Multi-node launch: how each member of a replica spanning several nodes (a gang) is started
by its engine's own means, and which members must be up before which.

Each engine that can span nodes answers `Engine.gang_launch` with a `GangLaunch`; the fleet
asks it which ranks wait for which (it sends a member to its node once the addresses it needs
are known), the node agent asks it for the flags to add. The flags are the engines' own:

- vLLM (its multiprocessing executor across nodes, vLLM >= 0.11.1: vllm-project/vllm#23691):
  every node runs `vllm serve` with `--nnodes N --node-rank R --master-addr HEAD --master-port
  P`; the others add `--headless` and serve no HTTP (vllm/engine/arg_utils.py adds the four
  flags to the ParallelConfig group; vllm/config/parallel.py picks the mp backend on CUDA when
  nnodes > 1 and refuses Ray with it; vllm/entrypoints/cli/serve.py `run_headless` runs a bare
  MultiprocExecutor for `node_rank_within_dp > 0`, joining torch.distributed at
  master_addr:master_port). Older vLLM spans nodes only through a Ray cluster, which this
  launch does not drive.
- SGLang: every node runs `launch_server` with `--nnodes N --node-rank R --dist-init-addr
  HEAD:P` (sglang/srt/server_args.py); ranks >= 1 run their schedulers and a dummy health
  server on their --host/--port (sglang/srt/entrypoints/engine.py `_launch_subprocesses`,
  `launch_dummy_health_check_server`).
- llama.cpp: the other nodes run `rpc-server -H HOST -p PORT` (tools/rpc/README.md), the head
  runs llama-server with `--rpc HOST:PORT,...` (common/arg.cpp) and offloads layers to them;
  the workers listen first, the head connects to each.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.engines.errors import EngineError

MAX_GANG_NODES = 64
"""The most nodes one replica may span (a ceiling against absurd requests)."""


@dataclass
class EngineSingleNode(EngineError):
    """The engine has no multi-node launch the agent can drive."""

    engine: str = ""
    nodes: int = 0

    def metadata(self) -> dict[str, str]:
        return {"engine": self.engine, "nodes": str(self.nodes)}


@dataclass(frozen=True)
class MemberOrder:
    """What a gang member is told of its gang: its rank, the gang's size, and every
    member's gang address by rank ("" where not known yet). The fleet writes it for each
    member's node (fleet_svc/domain/gang.py `order_of`), the wire carries it as the agent
    protocol's `GangMember`, and the node agent holds it in its replica's spec."""

    rank: int
    nnodes: int
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class GangMember:
    """One member of a gang as its launch sees it: its order (`MemberOrder`) and where it
    listens.

    `host` and `port`: where this member listens for its gang (port 0: not chosen yet, or it
    does not listen); `peers`: every member's gang address by rank ("" where not known yet).
    """

    rank: int
    nnodes: int
    host: str = ""
    port: int = 0
    peers: tuple[str, ...] = ()

    def peer(self, rank: int) -> str:
        """The gang address of member `rank` ("" when not known)."""
        return self.peers[rank] if 0 <= rank < len(self.peers) else ""


@dataclass(frozen=True)
class GangLaunch:
    """How one member starts.

    `args`: the flags added after the profile's arguments (or, for a `worker`, the whole
    argument list of the engine's worker program, the profile's arguments not passed);
    `listens`: it opens a port its peers need (the agent picks it and reports it);
    `needs`: the ranks whose gang addresses must be known before it starts;
    `serves_http`: it answers the engine's health path (else the agent counts a running
    process as healthy: the head's health says whether the gang formed).
    """

    args: tuple[str, ...] = ()
    worker: bool = False
    listens: bool = False
    needs: tuple[int, ...] = ()
    serves_http: bool = True


def check_member(engine: str, member: GangMember) -> None:
    """Refuse a member no engine would start: a rank outside the gang, a gang of one or of
    more than MAX_GANG_NODES nodes.

    Raises:
        EngineSingleNode: the numbers do not describe a gang.
    """
    if not 2 <= member.nnodes <= MAX_GANG_NODES or not 0 <= member.rank < member.nnodes:
        raise EngineSingleNode(
            f"rank {member.rank} of {member.nnodes} nodes is not a gang member {engine} can "
            f"start: a gang spans 2 to {MAX_GANG_NODES} nodes, ranks 0 to nodes - 1",
            engine=engine,
            nodes=member.nnodes,
        )


def head_rendezvous(member: GangMember) -> tuple[str, int]:
    """The head's rendezvous (host, port) for engines that meet at rank 0: this member's own
    address on the head, the head's reported address on the others (("", 0) until known)."""
    if member.rank == 0:
        return member.host, member.port
    host, _, port = member.peer(0).rpartition(":")
    return (host, int(port)) if host and port.isdigit() else ("", 0)


def vllm_launch(member: GangMember) -> GangLaunch:
    """vLLM across nodes with its multiprocessing backend (see the module docstring)."""
    check_member("vllm", member)
    host, port = head_rendezvous(member)
    args = (
        "--nnodes",
        str(member.nnodes),
        "--node-rank",
        str(member.rank),
        "--master-addr",
        host,
        "--master-port",
        str(port),
    )
    if member.rank == 0:
        return GangLaunch(args=args, listens=True)
    return GangLaunch(args=(*args, "--headless"), needs=(0,), serves_http=False)


def sglang_launch(member: GangMember) -> GangLaunch:
    """SGLang across nodes (see the module docstring)."""
    check_member("sglang", member)
    host, port = head_rendezvous(member)
    args = (
        "--nnodes",
        str(member.nnodes),
        "--node-rank",
        str(member.rank),
        "--dist-init-addr",
        f"{host}:{port}",
    )
    if member.rank == 0:
        return GangLaunch(args=args, listens=True)
    return GangLaunch(args=args, needs=(0,))


def llamacpp_launch(member: GangMember) -> GangLaunch:
    """llama.cpp's RPC backend: workers run rpc-server, the head lists them (see the module
    docstring)."""
    check_member("llamacpp", member)
    if member.rank == 0:
        workers = tuple(range(1, member.nnodes))
        listed = ",".join(member.peer(r) for r in workers)
        return GangLaunch(args=("--rpc", listed), needs=workers)
    return GangLaunch(
        args=("-H", member.host, "-p", str(member.port)),
        worker=True,
        listens=True,
        serves_http=False,
    )
