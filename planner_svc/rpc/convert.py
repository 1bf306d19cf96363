"""Conversion between the contract's messages and the planner's domain values."""

from __future__ import annotations

from llmgw.common.v1 import common_pb2
from planner_svc.domain import errors
from planner_svc.domain.context import ContextChange, ProfileChange, ProfileNeed
from planner_svc.domain.gpus import GPUsChange
from planner_svc.domain.model import Inventory, Model, Node, Profile
from planner_svc.domain.shape import Layer, LayerKind, ModelShape

MAX_LAYERS = 4096
"""More layers than any model has: an inline shape past it is refused."""
MAX_HEADS = 65_536
MAX_HEAD_DIM = 65_536
MAX_COUNT = 1 << 20
"""A ceiling on cards, nodes and replicas in a request."""

_KINDS: dict[int, LayerKind] = {
    common_pb2.LAYER_KIND_FULL: LayerKind.FULL,
    common_pb2.LAYER_KIND_SLIDING: LayerKind.SLIDING,
    common_pb2.LAYER_KIND_MLA: LayerKind.MLA,
    common_pb2.LAYER_KIND_RECURRENT: LayerKind.RECURRENT,
    common_pb2.LAYER_KIND_NO_CACHE: LayerKind.NO_CACHE,
}
_KIND_VALUES: dict[LayerKind, common_pb2.LayerKind.ValueType] = {
    LayerKind.FULL: common_pb2.LAYER_KIND_FULL,
    LayerKind.SLIDING: common_pb2.LAYER_KIND_SLIDING,
    LayerKind.MLA: common_pb2.LAYER_KIND_MLA,
    LayerKind.RECURRENT: common_pb2.LAYER_KIND_RECURRENT,
    LayerKind.NO_CACHE: common_pb2.LAYER_KIND_NO_CACHE,
}


def _count(value: int, field: str, maximum: int = MAX_COUNT) -> int:
    """A count from a request, refused when negative or absurd."""
    if value < 0 or value > maximum:
        raise errors.InvalidRequest(
            f"{field} is {value}: it must be between 0 and {maximum}", field=field
        )
    return value


def profile_from_proto(msg: common_pb2.Profile, index: int) -> Profile:
    """A domain profile, its numbers checked."""
    where = f"model.profiles[{index}]"
    if not msg.name:
        raise errors.InvalidRequest(f"{where} has no name: name every profile", field=where)
    return Profile(
        name=msg.name,
        engine=msg.engine,
        args=tuple(msg.args),
        gpu_class=msg.gpu_class,
        gpus_per_node=_count(msg.gpus_per_node, f"{where}.gpus_per_node"),
        tp=_count(msg.tp, f"{where}.tp"),
        pp=_count(msg.pp, f"{where}.pp"),
        nodes=_count(msg.nodes, f"{where}.nodes"),
        min_memory_gb=_count(msg.min_memory_gb, f"{where}.min_memory_gb"),
        cpu_only=msg.cpu_only,
        replicas=_count(msg.replicas, f"{where}.replicas"),
    )


def model_from_proto(msg: common_pb2.Model) -> Model:
    """A domain model, its numbers checked.

    Raises:
        InvalidRequest: a missing name, or a number out of range.
        InvalidShape: an inline shape that cannot size anything.
    """
    if not msg.name:
        raise errors.InvalidRequest(
            "the request names no model: set model.name", field="model.name"
        )
    files = []
    for i, f in enumerate(msg.origin.files):
        files.append((f.path, _count(f.bytes, f"model.origin.files[{i}].bytes", 1 << 50)))
    names = [p.name for p in msg.profiles]
    if len(set(names)) != len(names):
        raise errors.InvalidRequest(
            "two profiles share a name: give each profile its own", field="model.profiles"
        )
    return Model(
        name=msg.name,
        source=msg.source,
        files=tuple(files),
        context_length=_count(msg.context_length, "model.context_length", 1 << 40),
        max_output=_count(msg.max_output, "model.max_output", 1 << 40),
        profiles=tuple(profile_from_proto(p, i) for i, p in enumerate(msg.profiles)),
        shape=shape_from_proto(msg.shape) if msg.HasField("shape") else None,
    )


def inventory_from_proto(msg: common_pb2.Inventory) -> Inventory:
    """A domain inventory, its numbers checked."""
    nodes = []
    for i, n in enumerate(msg.nodes):
        where = f"inventory.nodes[{i}]"
        gpus = _count(n.gpus, f"{where}.gpus", 4096)
        nodes.append(
            Node(
                name=n.name,
                gpu_class=n.gpu_class,
                gpus=gpus,
                free_gpus=_count(n.free_gpus, f"{where}.free_gpus", 4096),
                gpu_memory_bytes=_count(n.gpu_memory_bytes, f"{where}.gpu_memory_bytes", 1 << 50),
                memory_bytes=_count(n.memory_bytes, f"{where}.memory_bytes", 1 << 60),
            )
        )
    return Inventory(nodes=tuple(nodes))


def shape_from_proto(msg: common_pb2.ModelShape) -> ModelShape:
    """A shape given inline: per-layer geometry if given, else `layers` alike layers.

    Raises:
        InvalidShape: numbers missing, negative or absurd.
    """

    def bounded(value: int, name: str, maximum: int) -> int:
        if value < 0 or value > maximum:
            raise errors.InvalidShape(
                f"the inline shape's {name} is {value}: it must be between 0 and {maximum}",
                source="inline",
            )
        return value

    if msg.layer_shapes:
        if len(msg.layer_shapes) > MAX_LAYERS:
            raise errors.InvalidShape(
                f"the inline shape has {len(msg.layer_shapes)} layers, more than {MAX_LAYERS}",
                source="inline",
            )
        layers = tuple(
            Layer(
                kind=_KINDS.get(la.kind, LayerKind.FULL),
                kv_heads=bounded(la.kv_heads, "kv_heads", MAX_HEADS),
                head_dim_k=bounded(la.head_dim_k, "head_dim_k", MAX_HEAD_DIM),
                head_dim_v=bounded(la.head_dim_v, "head_dim_v", MAX_HEAD_DIM),
                window_tokens=bounded(la.window_tokens, "window_tokens", 1 << 40),
                state_bytes=bounded(la.state_bytes, "state_bytes", 1 << 40),
            )
            for la in msg.layer_shapes
        )
    else:
        count = bounded(msg.layers, "layers", MAX_LAYERS)
        kv_heads = bounded(msg.kv_heads or msg.attention_heads, "kv_heads", MAX_HEADS)
        dk = bounded(msg.head_dim_k, "head_dim_k", MAX_HEAD_DIM)
        dv = bounded(msg.head_dim_v or msg.head_dim_k, "head_dim_v", MAX_HEAD_DIM)
        if count == 0 or kv_heads == 0 or dk == 0:
            raise errors.InvalidShape(
                "an inline shape needs layers, kv_heads and head_dim_k (or layer_shapes)",
                source="inline",
            )
        kinds = [_KINDS.get(k, LayerKind.FULL) for k in msg.layer_kinds] or [LayerKind.FULL] * count
        if len(kinds) != count:
            raise errors.InvalidShape(
                f"the inline shape lists {len(kinds)} layer kinds for {count} layers",
                source="inline",
            )
        window = bounded(msg.sliding_window, "sliding_window", 1 << 40)
        of_kind = {
            kind: Layer(
                kind=kind,
                kv_heads=kv_heads if kind is not LayerKind.RECURRENT else 0,
                head_dim_k=dk,
                head_dim_v=dv,
                window_tokens=window if kind is LayerKind.SLIDING else 0,
            )
            for kind in set(kinds)
        }
        layers = tuple(of_kind[kind] for kind in kinds)
    heads = bounded(msg.attention_heads, "attention_heads", MAX_HEADS)
    kv = max((la.kv_heads for la in layers if la.has_kv), default=0)
    return ModelShape(
        architecture=msg.architecture or "inline",
        layers=layers,
        attention_heads=heads or kv,
        kv_heads=bounded(msg.kv_heads, "kv_heads", MAX_HEADS) or kv,
        trained_context=bounded(msg.trained_context, "trained_context", 1 << 40),
        weights_bytes=bounded(msg.weights_bytes, "weights_bytes", 1 << 50),
        kv_dtype_bytes=bounded(msg.kv_dtype_bytes, "kv_dtype_bytes", 8) or 2,
        format="inline",
    )


def shape_to_proto(shape: ModelShape) -> common_pb2.ModelShape:
    """The resolved shape as the contract carries it."""
    return common_pb2.ModelShape(
        architecture=shape.architecture,
        layers=shape.block_count,
        attention_heads=shape.attention_heads,
        kv_heads=shape.kv_heads,
        head_dim_k=shape.head_dim_k,
        head_dim_v=shape.head_dim_v,
        trained_context=shape.trained_context,
        weights_bytes=shape.weights_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token(),
        kv_bytes_fixed=shape.kv_bytes_fixed(),
        state_bytes_per_sequence=shape.state_bytes_per_sequence(),
        sliding_window=shape.sliding_window,
        layer_kinds=[_KIND_VALUES[la.kind] for la in shape.layers],
        layer_shapes=[
            common_pb2.LayerShape(
                kind=_KIND_VALUES[la.kind],
                kv_heads=la.kv_heads,
                head_dim_k=la.head_dim_k,
                head_dim_v=la.head_dim_v,
                window_tokens=la.window_tokens,
                state_bytes=la.state_bytes,
            )
            for la in shape.layers
        ],
        kv_dtype_bytes=shape.kv_dtype_bytes,
        format=shape.format,
        notes=list(shape.notes),
    )


def profile_to_proto(p: Profile) -> common_pb2.Profile:
    """A profile as the contract carries it."""
    return common_pb2.Profile(
        name=p.name,
        engine=p.engine,
        args=list(p.args),
        gpu_class=p.gpu_class,
        gpus_per_node=p.gpus_per_node,
        tp=p.tp,
        pp=p.pp,
        nodes=p.nodes,
        min_memory_gb=p.min_memory_gb,
        cpu_only=p.cpu_only,
        replicas=p.replicas,
    )


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
