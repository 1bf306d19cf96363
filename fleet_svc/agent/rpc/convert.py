"""The agent's values to and from the agent stream's protos (`llmgw.agent.v1`)."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from fleet_svc.agent.replica import Observation, Phase, Progress, ReplicaSpec, Stage
from llmgw.agent.v1 import agent_pb2
from llmgw.card import Card
from llmgw.common.v1 import common_pb2
from llmgw.engines.gang import MemberOrder
from llmgw.rejection import Rejection

PHASES: dict[Phase, agent_pb2.ProcessPhase.ValueType] = {
    Phase.STARTING: agent_pb2.PROCESS_PHASE_STARTING,
    Phase.HEALTHY: agent_pb2.PROCESS_PHASE_HEALTHY,
    Phase.UNHEALTHY: agent_pb2.PROCESS_PHASE_UNHEALTHY,
    Phase.CRASHED: agent_pb2.PROCESS_PHASE_CRASHED,
    Phase.STOPPING: agent_pb2.PROCESS_PHASE_STOPPING,
    Phase.STOPPED: agent_pb2.PROCESS_PHASE_STOPPED,
    Phase.FAILED: agent_pb2.PROCESS_PHASE_FAILED,
}


STAGES: dict[Stage, common_pb2.StartStage.ValueType] = {
    Stage.DOWNLOADING: common_pb2.START_STAGE_DOWNLOADING,
    Stage.LOADING: common_pb2.START_STAGE_LOADING,
}


def progress_to_proto(p: Progress) -> common_pb2.StartProgress:
    """A starting replica's progress as the fleet is told of it."""
    return common_pb2.StartProgress(
        stage=STAGES[p.stage],
        done_bytes=p.done_bytes,
        total_bytes=p.total_bytes,
        rate_bytes_per_s=p.rate_bytes_per_s,
        files_done=p.files_done,
        files_total=p.files_total,
        file=p.file,
    )


def spec_from_proto(msg: agent_pb2.ReplicaSpec) -> ReplicaSpec:
    """A desired replica as the agent works with it."""
    return ReplicaSpec(
        replica_id=msg.replica_id,
        revision=msg.revision,
        engine=msg.engine,
        model=msg.model,
        profile=msg.profile,
        args=tuple(msg.args),
        gpus=tuple(msg.gpus),
        source=msg.source,
        gang=(
            MemberOrder(rank=msg.gang.rank, nnodes=msg.gang.nnodes, peers=tuple(msg.gang.peers))
            if msg.HasField("gang")
            else None
        ),
        traceparent=msg.traceparent,
    )


def timestamp(seconds: float) -> Timestamp:
    """A protobuf Timestamp of wall-clock seconds."""
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def observation_to_proto(obs: Observation) -> agent_pb2.ObservedReplica:
    """What the fleet is told of one replica."""
    spec = obs.spec
    return agent_pb2.ObservedReplica(
        replica_id=spec.replica_id,
        revision=spec.revision,
        phase=PHASES[obs.phase],
        address=obs.address,
        pid=obs.pid,
        gpus=list(spec.gpus),
        restarts=obs.restarts,
        exit_code=obs.exit_code,
        message=obs.message,
        log_tail=list(obs.log_tail),
        model=spec.model,
        engine=spec.engine,
        since=timestamp(obs.since_s),
        gang_address=obs.gang_address,
        progress=progress_to_proto(obs.progress) if obs.progress is not None else None,
    )


def card_to_proto(card: Card) -> common_pb2.Card:
    """One card as the fleet is told of it."""
    return common_pb2.Card(
        index=card.index,
        uuid=card.uuid,
        model=card.model,
        memory_total_bytes=card.memory_total_bytes,
        memory_used_bytes=card.memory_used_bytes,
        cuda_memory_total_bytes=card.cuda_memory_total_bytes,
    )


def ack_to_proto(version: int, rejected: Sequence[Rejection]) -> agent_pb2.Ack:
    """The answer to a desired version."""
    return agent_pb2.Ack(
        version=version,
        rejected=[
            agent_pb2.Rejection(
                replica_id=r.replica_id,
                revision=r.revision,
                reason=r.reason,
                message=r.message,
            )
            for r in rejected
        ],
    )
