"""The contract's common messages (llmgw.common.v1) to and from the typed values of
`llmgw.model` and `llmgw.shape`, every number checked on the way in. The planner and the fleet
both convert here, once, at their process edge."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from llmgw.common.v1 import common_pb2
from llmgw.limits import DEFAULT_LIMITS, Limits
from llmgw.model import (
    InvalidValue,
    Inventory,
    Model,
    Node,
    Profile,
    check_nested,
    checked_count,
    checked_versions,
    scalar_fields,
)
from llmgw.shape import InvalidShape, Layer, LayerKind, ModelShape
from llmgw.text import check_text

MAX_LAYERS = 4096
"""More layers than any model has: an inline shape past it is refused."""
MAX_HEADS = 65_536
MAX_HEAD_DIM = 65_536

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


_MODEL_NESTED = frozenset({"files", "profiles", "shape"})
"""Model's fields converted by hand below (the origin's files, the profiles, the inline shape);
the rest are walked from the dataclass (`scalars_from_proto`, `scalars_to_proto`)."""
check_nested(Model, _MODEL_NESTED, __name__)
check_nested(Profile, frozenset(), __name__)


def scalars_from_proto(cls: type, msg: Message, where: str) -> dict[str, Any]:
    """The scalar fields of the dataclass `cls` read from the message of the same field names,
    each number checked against its field's maximum; as keyword arguments.

    Raises:
        InvalidValue: a number out of range, naming `where`.field.
    """
    out: dict[str, Any] = {}
    for s in scalar_fields(cls)[0]:
        value = getattr(msg, s.name)
        if s.kind is int:
            # The field's name is only spelled out for a refusal (this runs on every call).
            if value < 0 or value > s.maximum:
                checked_count(value, f"{where}.{s.name}", s.maximum)
        elif s.kind is tuple:
            value = tuple(value)
        out[s.name] = value
    return out


def scalars_to_proto(value: object) -> dict[str, Any]:
    """The scalar fields of a contract value as keyword arguments of its message."""
    return {
        s.name: list(getattr(value, s.name)) if s.kind is tuple else getattr(value, s.name)
        for s in scalar_fields(type(value))[0]
    }


def profile_from_proto(
    msg: common_pb2.Profile, index: int, limits: Limits = DEFAULT_LIMITS
) -> Profile:
    """A domain profile, its numbers and sizes checked.

    Raises:
        InvalidValue: a missing name, or a number out of range.
        LimitExceeded: more arguments, or a longer one, than `limits` allow.
    """
    where = f"model.profiles[{index}]"
    if not msg.name:
        raise InvalidValue(f"{where} has no name: name every profile", field=where)
    limits.check_count(len(msg.args), "max_args", f"{where}.args")
    for i, arg in enumerate(msg.args):
        limits.check_count(len(arg), "max_arg_bytes", f"{where}.args[{i}]")
        # An inline chat template spans lines; the printing side escapes them.
        check_text(arg, f"{where}.args[{i}]", multiline=True)
    for name in ("name", "engine", "gpu_class", "engine_version"):
        check_text(getattr(msg, name), f"{where}.{name}")
    return Profile(**scalars_from_proto(Profile, msg, where))


def model_from_proto(msg: common_pb2.Model, limits: Limits = DEFAULT_LIMITS) -> Model:
    """A domain model, its numbers checked; its sizes (profiles, arguments, files) checked
    against `limits` before anything is built from them.

    Raises:
        InvalidValue: a missing name, or a number out of range.
        LimitExceeded: more profiles, arguments or files than `limits` allow.
        InvalidShape: an inline shape that cannot size anything.
    """
    if not msg.name:
        raise InvalidValue("the request names no model: set model.name", field="model.name")
    limits.check_count(len(msg.profiles), "max_profiles", "model.profiles")
    limits.check_count(len(msg.origin.files), "max_files", "model.origin.files")
    check_text(msg.name, "model.name")
    check_text(msg.origin.repo, "model.origin.repo")
    check_text(msg.origin.revision, "model.origin.revision")
    files = []
    for i, f in enumerate(msg.origin.files):
        check_text(f.path, f"model.origin.files[{i}].path")
        files.append((f.path, checked_count(f.bytes, f"model.origin.files[{i}].bytes", 1 << 50)))
    names = [p.name for p in msg.profiles]
    if len(set(names)) != len(names):
        raise InvalidValue(
            "two profiles share a name: give each profile its own", field="model.profiles"
        )
    return Model(
        **scalars_from_proto(Model, msg, "model"),
        files=tuple(files),
        profiles=tuple(profile_from_proto(p, i, limits) for i, p in enumerate(msg.profiles)),
        shape=shape_from_proto(msg.shape) if msg.HasField("shape") else None,
    )


def inventory_from_proto(msg: common_pb2.Inventory, limits: Limits = DEFAULT_LIMITS) -> Inventory:
    """A domain inventory, its numbers checked (and its node count against `limits`).

    Raises:
        InvalidValue: a number out of range.
        LimitExceeded: more nodes than `limits` allow.
    """
    limits.check_count(len(msg.nodes), "max_nodes", "inventory.nodes")
    nodes = []
    for i, n in enumerate(msg.nodes):
        where = f"inventory.nodes[{i}]"
        check_text(n.name, f"{where}.name")
        check_text(n.gpu_class, f"{where}.gpu_class")
        gpus = checked_count(n.gpus, f"{where}.gpus", 4096)
        nodes.append(
            Node(
                name=n.name,
                gpu_class=n.gpu_class,
                gpus=gpus,
                free_gpus=checked_count(n.free_gpus, f"{where}.free_gpus", 4096),
                gpu_memory_bytes=checked_count(
                    n.gpu_memory_bytes, f"{where}.gpu_memory_bytes", 1 << 50
                ),
                memory_bytes=checked_count(n.memory_bytes, f"{where}.memory_bytes", 1 << 60),
                gpu_cuda_memory_bytes=checked_count(
                    n.gpu_cuda_memory_bytes, f"{where}.gpu_cuda_memory_bytes", 1 << 50
                ),
                engine_versions=checked_versions(n.engine_versions, f"{where}.engine_versions"),
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
            raise InvalidShape(
                f"the inline shape's {name} is {value}: it must be between 0 and {maximum}",
                source="inline",
            )
        return value

    if msg.layer_shapes:
        if len(msg.layer_shapes) > MAX_LAYERS:
            raise InvalidShape(
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
            raise InvalidShape(
                "an inline shape needs layers, kv_heads and head_dim_k (or layer_shapes)",
                source="inline",
            )
        kinds = [_KINDS.get(k, LayerKind.FULL) for k in msg.layer_kinds] or [LayerKind.FULL] * count
        if len(kinds) != count:
            raise InvalidShape(
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
    return common_pb2.Profile(**scalars_to_proto(p))
