"""Gangs: which members of a replica spanning several nodes can be sent to their nodes now,
and what each is told of its gang."""

from __future__ import annotations

from fleet_svc.domain.replicas import Member, ReplicaState
from llmgw.engines import registry
from llmgw.engines.errors import EngineError
from llmgw.engines.gang import GangMember, MemberOrder


def needs(engine: str, rank: int, nnodes: int) -> tuple[int, ...] | None:
    """The ranks whose gang addresses rank `rank` needs before it starts (the engine's own
    order: vLLM and SGLang meet at the head, llama.cpp's head dials its RPC workers); None
    when the engine has no multi-node launch."""
    found = registry.find(engine)
    if found is None:
        return None
    try:
        return found.gang_launch((), GangMember(rank=rank, nnodes=nnodes)).needs
    except EngineError:
        return None


def launchable(r: ReplicaState) -> list[Member]:
    """The members of gang `r` that can be started now: those whose engine needs no
    address not yet reported. A member already reported by its agent stays (it runs)."""
    n = len(r.members)
    out = []
    for m in r.members:
        wanted = needs(r.spec.engine, m.rank, n)
        if wanted is None:
            continue
        if m.gang_address or all(r.members[k].gang_address for k in wanted if k < n):
            out.append(m)
    return out


def order_of(r: ReplicaState, node: str) -> MemberOrder | None:
    """What the member of gang `r` on `node` is told (None: `r` has none there)."""
    m = r.member_on(node)
    if m is None or not r.gang:
        return None
    return MemberOrder(
        rank=m.rank, nnodes=len(r.members), peers=tuple(x.gang_address for x in r.members)
    )


def spans_nodes(engine: str) -> bool:
    """Whether the engine has a multi-node launch the agent drives."""
    return needs(engine, 0, 2) is not None
