"""A gang member's command line: the engine's own multi-node launch (llmgw.engines.gang)
added to what the agent runs for one node, or the engine's worker program for the ranks that
run one (llama.cpp's rpc-server)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from fleet_svc.agent.config import EngineConfig
from fleet_svc.agent.replica import ReplicaSpec
from llmgw.engines import registry
from llmgw.engines.errors import EngineError
from llmgw.engines.gang import GangMember


class GangRefused(Exception):
    """This agent cannot start the member as asked; the message says why."""


PEER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,252}:[0-9]{1,5}$")
"""A peer's gang address as the agent passes it to an engine: a host name or IPv4 address
and a port, so it can never read as a flag or carry another value."""


def check_peers(peers: tuple[str, ...], nnodes: int) -> None:
    """Refuse peer addresses no engine should be given: more than the gang's nodes, or one
    that is not HOST:PORT.

    Raises:
        GangRefused: naming the address.
    """
    if len(peers) > nnodes:
        raise GangRefused(f"{len(peers)} peer addresses for a gang of {nnodes} nodes")
    for peer in peers:
        if peer and (not PEER.fullmatch(peer) or not 0 < int(peer.rsplit(":", 1)[1]) < 65536):
            raise GangRefused(f"peer address {peer[:80]!r} is not HOST:PORT; refusing to pass it")


@dataclass(frozen=True)
class MemberCommand:
    """What runs one gang member: its argv, the port it listens on for its gang (0: none),
    and whether it answers the engine's health path."""

    argv: list[str]
    gang_port: int
    serves_http: bool


def member_command(
    engine: EngineConfig,
    spec: ReplicaSpec,
    host: str,
    port: int,
    advertise: str,
    pick_port: Callable[[], int],
) -> MemberCommand:
    """The command of `spec`'s gang member on this node.

    Args:
        engine: the configured engine (its family names the launch: a stand-in configured as
            `vllm` launches as vLLM would).
        spec: the replica, with its gang member (`spec.gang` set).
        host, port: where the engine serves HTTP.
        advertise: this node's address as its peers reach it.
        pick_port: a free port for a member that listens for its gang.
    Raises:
        GangRefused: the engine has no multi-node launch, the member is no gang's, a peer
            address it needs is missing, or its worker program is not configured.
    """
    gang = spec.gang
    assert gang is not None
    check_peers(gang.peers, gang.nnodes)
    family = registry.find(engine.rules.family) or registry.find(spec.engine)
    if family is None:
        raise GangRefused(f"engine {spec.engine} has no multi-node launch")
    member = GangMember(rank=gang.rank, nnodes=gang.nnodes, host=advertise, peers=gang.peers)
    try:
        launch = family.gang_launch(spec.args, member)
        gang_port = pick_port() if launch.listens else 0
        if gang_port:
            member = GangMember(gang.rank, gang.nnodes, advertise, gang_port, gang.peers)
            launch = family.gang_launch(spec.args, member)
    except EngineError as exc:
        raise GangRefused(exc.message) from exc
    missing = [r for r in launch.needs if not member.peer(r)]
    if missing:
        raise GangRefused(
            f"rank {gang.rank} needs the gang addresses of ranks {missing}, which the fleet "
            "has not sent"
        )
    if launch.worker:
        if not engine.worker_program:
            raise GangRefused(
                f"rank {gang.rank} of a {spec.engine} gang runs the engine's worker program, "
                f"and this agent's {engine.name} engine names none (worker_executable)"
            )
        return MemberCommand([*engine.worker_program, *launch.args], gang_port, False)
    argv = [*engine.command(spec, host, port), *launch.args]
    return MemberCommand(argv, gang_port, launch.serves_http)


def serves_http(engine: EngineConfig, spec: ReplicaSpec) -> bool:
    """Whether `spec`'s process answers the engine's health path (every replica on one node
    does; a gang's headless members and RPC workers do not)."""
    gang = spec.gang
    if gang is None:
        return True
    family = registry.find(engine.rules.family) or registry.find(spec.engine)
    try:
        return (
            family is None
            or family.gang_launch(
                spec.args, GangMember(gang.rank, gang.nnodes, peers=gang.peers)
            ).serves_http
        )
    except EngineError:
        return True
