"""Conversion between the fleet's values and its messages: the one place a catalog model
crosses the API, checked on the way in."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import fields, replace

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Entry, Revision, check_name, check_profiles
from fleet_svc.domain.endpoints import Endpoint
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import HOLDS_CARDS, ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, StartProgress
from fleet_svc.domain.rollout import (
    EventKind,
    Mode,
    Rollout,
    RolloutEvent,
    RolloutState,
    Stage,
    Strategy,
)
from fleet_svc.planner import BatchAnswer
from fleet_svc.rpc.canary_convert import canary_status, failure_info
from fleet_svc.watch import EndpointEvent
from fleet_svc.watch import EventKind as EndpointKind
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.limits import DEFAULT_LIMITS, LimitExceeded, Limits
from llmgw.model import InvalidValue, Inventory
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.common import model_from_proto, profile_to_proto, scalars_to_proto
from llmgw.shape import InvalidShape
from llmgw.sources import SourceRefused, parse_source, redacted


def fingerprint(request: Message) -> str:
    """A request's fingerprint for its request id: SHA-256 of its deterministic serialization
    with `request_id` cleared. Parsed and serialized again, so two encodings of one request
    (fields in another order, defaults written out) have one fingerprint."""
    bare = type(request)()
    bare.CopyFrom(request)
    bare.ClearField("request_id")
    return hashlib.sha256(bare.SerializeToString(deterministic=True)).hexdigest()


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    """A protobuf timestamp of seconds since the epoch."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def entry_in(msg: common_pb2.Model, limits: Limits = DEFAULT_LIMITS) -> Entry:
    """A catalog model from the API, refused when the fleet could not run it.

    Raises:
        InvalidModel: a bad name, profile or number, or an inline shape that sizes nothing.
        ModelTooLarge: more profiles, arguments or files than `limits` allow.
    """
    check_name(msg.name)
    try:
        model = model_from_proto(msg, limits)
    except LimitExceeded as exc:
        raise errors.ModelTooLarge(
            exc.message, field=exc.field, limit=exc.limit, maximum=exc.maximum, count=exc.count
        ) from exc
    except (InvalidValue, InvalidShape) as exc:
        raise errors.InvalidModel(exc.message, field=getattr(exc, "field", "model")) from exc
    check_profiles(model)
    shape = (
        json_format.MessageToDict(msg.shape, preserving_proto_field_name=True)
        if msg.HasField("shape")
        else None
    )
    return Entry(
        model=replace(model, shape=None),
        origin_repo=msg.origin.repo,
        origin_revision=msg.origin.revision,
        shape=shape,
    )


def check_source(source: str) -> None:
    """A model's source as the fleet accepts it (llmgw.sources): a URL, `hf://ORG/NAME[@REV]`
    or an absolute path (whether a node may read that path is its agent's to say, under the
    roots its config allows). Never anything an engine could read as a flag.

    Raises:
        InvalidSource: with the field `model.source`.
    """
    try:
        parse_source(source, allow_paths=True, field="model.source")
    except SourceRefused as exc:
        raise errors.InvalidSource(
            exc.message, field="model.source", source=redacted(source)[:200]
        ) from exc


def accepted_entry(msg: common_pb2.Model, limits: Limits = DEFAULT_LIMITS) -> Entry:
    """A model as CreateModel, UpdateModel and the settings file accept it: `entry_in`, and
    its source checked (`check_source`).

    Raises:
        InvalidModel, InvalidSource.
    """
    entry = entry_in(msg, limits)
    check_source(entry.model.source)
    return entry


def model_to_proto(entry: Entry) -> common_pb2.Model:
    """A catalog entry as the contract carries it (its shape as the caller wrote it)."""
    m = entry.model
    msg = common_pb2.Model(
        **scalars_to_proto(m),
        profiles=[profile_to_proto(p) for p in m.profiles],
    )
    if entry.origin_repo or entry.origin_revision or m.files:
        msg.origin.CopyFrom(
            common_pb2.Origin(
                repo=entry.origin_repo,
                revision=entry.origin_revision,
                files=[common_pb2.OriginFile(path=p, bytes=b) for p, b in m.files],
            )
        )
    if entry.shape is not None:
        msg.shape.CopyFrom(
            json_format.ParseDict(
                dict(entry.shape), common_pb2.ModelShape(), ignore_unknown_fields=True
            )
        )
    return msg


def inventory_to_proto(inventory: Inventory) -> common_pb2.Inventory:
    """An inventory as the contract carries it."""
    return common_pb2.Inventory(
        nodes=[
            common_pb2.InventoryNode(
                name=n.name,
                gpu_class=n.gpu_class,
                gpus=n.gpus,
                free_gpus=n.free_gpus,
                gpu_memory_bytes=n.gpu_memory_bytes,
                memory_bytes=n.memory_bytes,
                gpu_cuda_memory_bytes=n.gpu_cuda_memory_bytes,
                engine_versions=dict(n.engine_versions),
            )
            for n in inventory.nodes
        ]
    )


def catalog_model(rev: Revision) -> fleet_pb2.CatalogModel:
    """A revision as the API shows it, with its content's etag ("" for a dry run's)."""
    return fleet_pb2.CatalogModel(
        model=model_to_proto(rev.entry),
        revision=rev.revision,
        etag=rev.etag,
        updated_by=rev.updated_by,
        updated_at=timestamp(rev.updated_at),
        declared=bool(rev.declared_in),
        declared_in=rev.declared_in,
        deleted=rev.deleted,
    )


def replica(r: ReplicaState) -> fleet_pb2.Replica:
    """A replica as the API shows it."""
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
        engine=r.spec.engine,
        args=list(r.spec.args),
        members=[
            fleet_pb2.ReplicaMember(
                rank=m.rank,
                node=m.node,
                gpus=list(m.gpus),
                phase=fleet_pb2.ReplicaPhase.Value(f"REPLICA_PHASE_{m.phase.value}"),
                gang_address=m.gang_address,
            )
            for m in r.members
        ],
        progress=start_progress(r.progress) if r.progress is not None else None,
    )


_START_STAGES: dict[str, common_pb2.StartStage.ValueType] = {
    "DOWNLOADING": common_pb2.START_STAGE_DOWNLOADING,
    "LOADING": common_pb2.START_STAGE_LOADING,
}


def start_progress(p: StartProgress) -> common_pb2.StartProgress:
    """A starting replica's progress as the API shows it (an unknown stage as unspecified)."""
    return common_pb2.StartProgress(
        stage=_START_STAGES.get(p.stage, common_pb2.START_STAGE_UNSPECIFIED),
        done_bytes=p.done_bytes,
        total_bytes=p.total_bytes,
        rate_bytes_per_s=p.rate_bytes_per_s,
        files_done=p.files_done,
        files_total=p.files_total,
        file=p.file,
    )


def node(view: NodeView, replicas: list[ReplicaState], last_heard: float) -> fleet_pb2.Node:
    """A node as the API shows it, its free cards counted from the replicas on it."""
    used = {
        g
        for r in replicas
        if r.phase in HOLDS_CARDS
        for m in (r.members or (r,))
        if m.node == view.name
        for g in m.gpus
    }
    return fleet_pb2.Node(
        name=view.name,
        labels=view.labels,
        cards=[
            common_pb2.Card(
                index=c.index,
                uuid=c.uuid,
                model=c.model,
                memory_total_bytes=c.memory_total_bytes,
                memory_used_bytes=c.memory_used_bytes,
                cuda_memory_total_bytes=c.cuda_memory_total_bytes,
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


_KINDS = {
    EndpointKind.ADDED: fleet_pb2.WatchReplicasResponse.KIND_ADDED,
    EndpointKind.UPDATED: fleet_pb2.WatchReplicasResponse.KIND_UPDATED,
    EndpointKind.REMOVED: fleet_pb2.WatchReplicasResponse.KIND_REMOVED,
    EndpointKind.SYNCED: fleet_pb2.WatchReplicasResponse.KIND_SYNCED,
    EndpointKind.HEARTBEAT: fleet_pb2.WatchReplicasResponse.KIND_HEARTBEAT,
}
_DIALECTS = {
    "openai": fleet_pb2.API_DIALECT_OPENAI,
    "llamacpp": fleet_pb2.API_DIALECT_LLAMACPP,
    "tei": fleet_pb2.API_DIALECT_TEI,
}


def endpoint(e: Endpoint, phase: ReplicaPhase) -> fleet_pb2.Endpoint:
    """An endpoint as the gateway routes by it."""
    return fleet_pb2.Endpoint(
        replica_id=e.replica_id,
        model=e.model,
        profile=e.profile,
        address=e.address,
        phase=fleet_pb2.ReplicaPhase.Value(f"REPLICA_PHASE_{phase.value}"),
        revision=e.revision,
        node=e.node,
        engine=e.engine,
        api_dialect=_DIALECTS.get(e.api_dialect, fleet_pb2.API_DIALECT_UNSPECIFIED),
        context_tokens=e.context_tokens,
        max_output=e.max_output,
        slots=e.slots,
        cards=e.cards,
        gpus=list(e.gpus),
        gpu_class=e.gpu_class,
        weight=e.weight,
        ready_since=timestamp(e.ready_since_s),
    )


_CONVERTED: OrderedDict[int, tuple[EndpointEvent, fleet_pb2.WatchReplicasResponse]] = OrderedDict()
CONVERTED_KEPT = 4096
"""Events whose message is kept: one change goes to every watcher, converted once."""


def endpoint_event(e: EndpointEvent) -> fleet_pb2.WatchReplicasResponse:
    """An endpoint event as the gateway receives it (the same message for every stream that
    sends the same event: callers must not change it)."""
    hit = _CONVERTED.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    answer = _endpoint_event(e)
    if e.kind is not EndpointKind.HEARTBEAT:
        _CONVERTED[id(e)] = (e, answer)
        if len(_CONVERTED) > CONVERTED_KEPT:
            _CONVERTED.popitem(last=False)
    return answer


def _endpoint_event(e: EndpointEvent) -> fleet_pb2.WatchReplicasResponse:
    answer = fleet_pb2.WatchReplicasResponse(
        kind=_KINDS[e.kind],
        seq=e.seq,
        time=timestamp(e.at_s),
        epoch=e.epoch,
        resumed=e.resumed,
        note=e.note,
    )
    if e.endpoint is not None:
        removed = e.kind is EndpointKind.REMOVED
        phase = ReplicaPhase.DRAINING if removed else ReplicaPhase.READY
        answer.endpoint.CopyFrom(endpoint(e.endpoint, phase))
    if e.reason is not None:
        answer.reason = fleet_pb2.EndpointReason.Value(f"ENDPOINT_REASON_{e.reason.value}")
    return answer


__all__ = ["NodePhase", "catalog_model", "endpoint_event", "node", "replica", "timestamp"]


_STRATEGIES = {
    Strategy.BESIDE: fleet_pb2.STRATEGY_BESIDE,
    Strategy.IN_PLACE: fleet_pb2.STRATEGY_IN_PLACE,
    Strategy.AUTO: fleet_pb2.STRATEGY_AUTO,
    Strategy.CANARY: fleet_pb2.STRATEGY_CANARY,
}


_MODES = {
    Mode.UNDECIDED: fleet_pb2.ROLLOUT_MODE_UNSPECIFIED,
    Mode.BESIDE: fleet_pb2.ROLLOUT_MODE_BESIDE,
    Mode.IN_PLACE: fleet_pb2.ROLLOUT_MODE_IN_PLACE,
}


def stage_of(stage: Stage) -> fleet_pb2.RolloutStage.ValueType:
    """A step's stage as the API's enum."""
    return fleet_pb2.RolloutStage.Value(f"ROLLOUT_STAGE_{stage.name}")


def mode_of(mode: Mode) -> fleet_pb2.RolloutMode.ValueType:
    """A step's or event's mode as the API's enum."""
    return _MODES[mode]


_EVENT_KINDS: dict[EventKind, fleet_pb2.RolloutEventKind.ValueType] = {
    k: fleet_pb2.RolloutEventKind.Value(f"ROLLOUT_EVENT_KIND_{k.name}")
    for k in EventKind
    if k is not EventKind.UNKNOWN
}


def event_kind_of(kind: EventKind) -> fleet_pb2.RolloutEventKind.ValueType:
    """An event's kind as the API's enum (unspecified for one this code does not know)."""
    return _EVENT_KINDS.get(kind, fleet_pb2.ROLLOUT_EVENT_KIND_UNSPECIFIED)


def rollout_state_of(state: RolloutState) -> fleet_pb2.RolloutState.ValueType:
    """A rollout's state as the API's enum. The API has no pending state: a rollout committed
    with its change and not yet taken up by the controller reads as RUNNING (its steps as the
    change planned them, none started), which it is about to be."""
    if state is RolloutState.PENDING:
        return fleet_pb2.ROLLOUT_STATE_RUNNING
    return fleet_pb2.RolloutState.Value(f"ROLLOUT_STATE_{state.value}")


def rollout(ro: Rollout, undo_available: bool = False) -> fleet_pb2.Rollout:
    """A rollout as the API shows it."""
    answer = fleet_pb2.Rollout(
        id=ro.id,
        model=ro.model,
        kind=ro.kind,
        strategy=_STRATEGIES[ro.strategy],
        state=rollout_state_of(ro.state),
        from_revision=ro.from_revision,
        to_revision=ro.to_revision,
        steps=[
            fleet_pb2.RolloutStep(
                profile=s.profile,
                old_replica=s.old_id,
                new_replica=s.new_id,
                mode=mode_of(s.mode),
                stage=stage_of(s.stage),
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
    if ro.canary is not None:
        answer.canary.CopyFrom(
            canary_status(
                ro.canary, canary_revision=ro.to_revision, baseline_revision=ro.from_revision
            )
        )
    failure = failure_info(ro)
    if failure is not None:
        answer.failure.CopyFrom(failure)
    return answer


def rollout_event(e: RolloutEvent, ro: Rollout | None = None) -> fleet_pb2.WatchRolloutResponse:
    """A rollout event as the stream sends it (`ro`, the rollout, names the revisions of a
    canary event's figures)."""
    ev = e.event
    answer = fleet_pb2.WatchRolloutResponse(
        rollout_id=e.rollout_id,
        seq=e.seq,
        at=timestamp(e.at_s),
        kind=event_kind_of(ev.kind),
        replica_id=ev.replica_id,
        node=ev.node,
        gpus=list(ev.gpus),
        mode=mode_of(ev.mode),
        message=ev.message,
        state=rollout_state_of(e.state),
        profile=ev.profile,
    )
    run = ev.canary
    if run is not None:
        answer.canary.CopyFrom(
            canary_status(
                run,
                canary_revision=ro.to_revision if ro is not None else 0,
                baseline_revision=ro.from_revision if ro is not None else 0,
            )
        )
    return answer


_BATCH_FIELDS = tuple(f.name for f in fields(BatchAnswer))


def batch_from_proto(msg: planner_pb2.BatchFit) -> BatchAnswer:
    """The planner's answer on a batch, as the fleet keeps it."""
    return BatchAnswer(**{name: getattr(msg, name) for name in _BATCH_FIELDS})


def batch_to_proto(batch: BatchAnswer) -> planner_pb2.BatchFit:
    """A batch's answer as the fleet's SetContext and SetGPUs give it back."""
    return planner_pb2.BatchFit(**{name: getattr(batch, name) for name in _BATCH_FIELDS})
