"""The planner's answers as the contract carries them (the common values convert in
`llmgw.rpc.common`)."""

from __future__ import annotations

from llmgw.common.v1 import common_pb2
from planner_svc.domain.context import ContextChange, ProfileChange, ProfileNeed
from planner_svc.domain.gpus import GPUsChange


def _memory(need: ProfileNeed) -> common_pb2.Memory | None:
    """A profile's need in bytes, None when it was not sized."""
    if need.card is not None:
        c = need.card
        return common_pb2.Memory(
            weights_bytes=c.weights_bytes,
            kv_bytes=c.kv_bytes,
            per_card_bytes=c.per_card_bytes,
            budget_bytes=c.budget_bytes,
            cards=c.cards,
            overhead_bytes=c.overhead_bytes,
            devices=[
                common_pb2.DevicePlacement(
                    device=d.device,
                    layers=d.layers,
                    first_layer=d.first_layer,
                    last_layer=d.last_layer,
                    output=d.output,
                    weights_bytes=d.weights_bytes,
                    kv_bytes=d.kv_bytes,
                    compute_bytes=d.compute_bytes,
                )
                for d in c.devices
            ],
        )
    if need.ram_bytes:
        return common_pb2.Memory(ram_bytes=need.ram_bytes)
    return None


def profile_change_to_proto(c: ProfileChange) -> common_pb2.ProfileChange:
    """One profile's part of a change."""
    msg = common_pb2.ProfileChange(
        profile=c.profile,
        engine=c.engine,
        before=c.before,
        after=c.after,
        args=list(c.args),
        args_before=list(c.args_before),
    )
    after, before = _memory(c.need), _memory(c.need_before)
    if after is not None:
        msg.memory.CopyFrom(after)
    if before is not None:
        msg.memory_before.CopyFrom(before)
    return msg


def context_change_to_proto(c: ContextChange) -> common_pb2.ContextChange:
    """A context change as the contract carries it."""
    return common_pb2.ContextChange(
        model=c.model,
        before=c.before,
        after=c.after,
        max_output=c.max_output,
        trained=c.trained,
        profiles=[profile_change_to_proto(p) for p in c.profiles],
        note=c.note,
    )


def gpus_change_to_proto(c: GPUsChange) -> common_pb2.GPUsChange:
    """A GPU change as the contract carries it."""
    return common_pb2.GPUsChange(
        model=c.model,
        gpus=c.gpus,
        profiles=[profile_change_to_proto(p) for p in c.profiles],
        note=c.note,
    )
