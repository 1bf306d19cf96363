"""Conversion between the fleet's state and its messages."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from fleet_svc.catalog import model_of
from fleet_svc.domain.control import ReplicaState
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import HOLDS_CARDS, ReplicaPhase
from fleet_svc.store.base import ModelRecord
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
