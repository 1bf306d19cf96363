"""Conversion between the fleet's state and its messages."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from fleet_svc.catalog import model_of
from fleet_svc.domain.control import ReplicaState
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import HOLDS_CARDS, ReplicaPhase
from fleet_svc.domain.rollout import Rollout, Strategy
from fleet_svc.store.base import EventRecord, ModelRecord
from fleet_svc.watch import EndpointEvent
from llmgw.agent.v1 import agent_pb2
from llmgw.fleet.v1 import fleet_pb2


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A protobuf timestamp of seconds since the epoch."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def catalog_model(record: ModelRecord) -> fleet_pb2.CatalogModel:
    """A stored revision as the API shows it; the revision is the etag."""
    return fleet_pb2.CatalogModel(
        model=model_of(record),
        revision=record.revision,
        etag=str(record.revision),
        updated_by=record.updated_by,
        updated_at=timestamp(record.updated_at),
        declared=bool(record.declared_in),
        declared_in=record.declared_in,
        deleted=record.deleted,
    )


def replica(r: ReplicaState) -> fleet_pb2.Replica:
    """A replica as the API shows it."""
    args = r.spec.get("args", [])
    return fleet_pb2.Replica(
        id=r.id,
        model=r.model,
        profile=r.profile,
        revision=r.revision,
        node=r.node,
        gpus=list(r.gpus),
        phase=fleet_pb2.ReplicaPhase.Value(f"REPLICA_PHASE_{r.phase.value}"),
        reason=r.reason,
        address=r.address,
        restarts=r.restarts,
        since=timestamp(r.since_s),
        engine=str(r.spec.get("engine", "")),
        args=[str(a) for a in args] if isinstance(args, list) else [],
    )


def node(view: NodeView, replicas: list[ReplicaState], last_heard: float) -> fleet_pb2.Node:
    """A node as the API shows it, its free cards counted from the replicas on it."""
    used = {g for r in replicas if r.node == view.name and r.phase in HOLDS_CARDS for g in r.gpus}
    return fleet_pb2.Node(
        name=view.name,
        labels=view.labels,
        cards=[
            agent_pb2.Card(
                index=c.index,
                uuid=c.uuid,
                model=c.model,
                memory_total_bytes=c.memory_total_bytes,
                memory_used_bytes=c.memory_used_bytes,
            )
            for c in view.cards
        ],
        phase=fleet_pb2.NodePhase.Value(f"NODE_PHASE_{view.phase.value}"),
        gpu_class=view.gpu_class,
        free_gpus=sum(1 for c in view.cards if c.index not in used),
        memory_bytes=view.memory_bytes,
        memory_free_bytes=view.memory_free_bytes,
        last_heartbeat=timestamp(last_heard),
        engines=list(view.engines),
        reason=view.reason,
    )


def endpoint_event(e: EndpointEvent, synced: bool) -> fleet_pb2.WatchReplicasResponse:
    """An endpoint event as the gateway receives it."""
    if synced:
        return fleet_pb2.WatchReplicasResponse(kind=fleet_pb2.WatchReplicasResponse.KIND_SYNCED)
    phase = ReplicaPhase.READY if e.added else ReplicaPhase.DRAINING
    return fleet_pb2.WatchReplicasResponse(
        kind=fleet_pb2.WatchReplicasResponse.KIND_ADDED
        if e.added
        else fleet_pb2.WatchReplicasResponse.KIND_REMOVED,
        endpoint=fleet_pb2.Endpoint(
            replica_id=e.replica_id,
            model=e.model,
            profile=e.profile,
            address=e.address,
            phase=fleet_pb2.ReplicaPhase.Value(f"REPLICA_PHASE_{phase.value}"),
            revision=e.revision,
            node=e.node,
        ),
    )


__all__ = ["NodePhase", "catalog_model", "endpoint_event", "node", "replica", "timestamp"]


_STRATEGIES = {
    Strategy.BESIDE: fleet_pb2.STRATEGY_BESIDE,
    Strategy.IN_PLACE: fleet_pb2.STRATEGY_IN_PLACE,
    Strategy.AUTO: fleet_pb2.STRATEGY_AUTO,
}


def strategy_of(value: int, in_place: bool = False) -> Strategy:
    """The strategy a request asks for (unset: beside; `in_place` wins over unset)."""
    if value == fleet_pb2.STRATEGY_IN_PLACE or (in_place and value == 0):
        return Strategy.IN_PLACE
    if value == fleet_pb2.STRATEGY_AUTO:
        return Strategy.AUTO
    return Strategy.BESIDE


def rollout(ro: Rollout, undo_available: bool = False) -> fleet_pb2.Rollout:
    """A rollout as the API shows it."""
    return fleet_pb2.Rollout(
        id=ro.id,
        model=ro.model,
        kind=ro.kind,
        strategy=_STRATEGIES[ro.strategy],
        state=fleet_pb2.RolloutState.Value(f"ROLLOUT_STATE_{ro.state.value}"),
        from_revision=ro.from_revision,
        to_revision=ro.to_revision,
        steps=[
            fleet_pb2.RolloutStep(
                profile=s.profile,
                old_replica=s.old_id,
                new_replica=s.new_id,
                mode=s.mode,
                stage=s.stage.value,
                node=s.node,
                gpus=list(s.gpus),
                message=s.message,
            )
            for s in ro.steps
        ],
        reason=ro.reason,
        log_tail=list(ro.log_tail),
        created_at=timestamp(ro.created_s),
        updated_at=timestamp(ro.updated_s or ro.created_s),
        created_by=ro.by,
        undo_of=ro.undo_of,
        undo_available=undo_available,
        surge=ro.surge,
    )


def rollout_event(e: EventRecord) -> fleet_pb2.WatchRolloutResponse:
    """A stored rollout event as the stream sends it."""
    ev = e.event
    state = str(ev.get("state", "RUNNING"))
    return fleet_pb2.WatchRolloutResponse(
        rollout_id=e.rollout_id,
        seq=e.seq,
        at=timestamp(e.at),
        kind=str(ev.get("kind", "")),
        replica_id=str(ev.get("replica_id", "")),
        node=str(ev.get("node", "")),
        gpus=[int(g) for g in ev.get("gpus", [])],
        mode=str(ev.get("mode", "")),
        message=str(ev.get("message", "")),
        state=fleet_pb2.RolloutState.Value(f"ROLLOUT_STATE_{state}"),
        profile=str(ev.get("profile", "")),
    )
