"""Messages with every field set to a value other than its default, built from the proto
descriptors: a field added to the contract is set here without anyone listing it, so a layer
that drops it fails the round trip that carries it (tests/integration/test_field_round_trip.py).

Only fields the fleet checks (a name, a source, an engine, bounded numbers) get a value chosen
for them (`CHOSEN`); every other field gets one made from its type, its number and a seed, so
two seeds give two messages that differ in every field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

F = FieldDescriptor

CHOSEN: dict[str, Callable[[int, int], object]] = {
    # (seed, index in a repeated field) -> value; keyed by "Message.field".
    "Model.name": lambda seed, _i: f"round-trip-{seed}",
    "Model.source": lambda seed, _i: f"hf://org/round-trip-{seed}",
    "Profile.name": lambda seed, i: f"profile-{seed}-{i}",
    "Profile.engine": lambda seed, i: ("vllm", "llamacpp", "sglang")[(seed + i) % 3],
    "Profile.engine_version": lambda seed, i: f"0.{10 + seed}.{i}",
    "Profile.args": lambda seed, i: f"--flag-{seed}-{i}",
    # A replica spans one node: more would need a multi-node launch the test is not about.
    "Profile.nodes": lambda _seed, _i: 1,
    # A few replicas: each is a row the controller keeps (no agent runs them here).
    "Profile.replicas": lambda seed, i: seed + i,
    # A canary's steps rise within 1..100 % (fleet_svc/domain/canary.py policy_of).
    "CanaryPolicy.steps": lambda seed, i: 10 * seed + 20 * i + 1,
    # One cache element's bytes: 1..8 (llmgw.rpc.common.shape_from_proto).
    "ModelShape.kv_dtype_bytes": lambda seed, _i: seed,
}


def _scalar(field: Any, seed: int, index: int) -> object:
    """A value of the field's type, not its default, distinct per seed."""
    if field.cpp_type == F.CPPTYPE_STRING:
        return f"{field.name}-{seed}-{index}"
    if field.cpp_type == F.CPPTYPE_BOOL:
        return True
    if field.cpp_type == F.CPPTYPE_ENUM:
        values = [v.number for v in field.enum_type.values if v.number != 0]
        return values[(seed + index) % len(values)]
    if field.cpp_type in (F.CPPTYPE_DOUBLE, F.CPPTYPE_FLOAT):
        return 0.25 * (seed + index + 1)
    # Every integer: small (within every bound the fleet checks) and distinct per seed.
    return 10 * seed + field.number + index


def _value(desc: Any, field: Any, seed: int, index: int) -> object:
    chosen = CHOSEN.get(f"{desc.name}.{field.name}")
    return chosen(seed, index) if chosen is not None else _scalar(field, seed, index)


def fill(msg: Message, seed: int) -> Message:
    """`msg` with every field (nested messages' too) set to a non-default value; repeated
    fields and maps get two entries. Returns `msg`."""
    desc = msg.DESCRIPTOR
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entries = getattr(msg, field.name)
            entry_fields = field.message_type.fields_by_name
            key_f, value_f = entry_fields["key"], entry_fields["value"]
            for i in range(2):
                key = _value(field.message_type, key_f, seed, i)
                if value_f.message_type is not None:
                    fill(entries[key], seed + i)
                else:
                    entries[key] = _value(field.message_type, value_f, seed, i)
        elif field.is_repeated:
            items = getattr(msg, field.name)
            for i in range(2):
                if field.message_type is not None:
                    fill(items.add(), seed + i)
                else:
                    items.append(_value(desc, field, seed, i))
        elif field.message_type is not None:
            fill(getattr(msg, field.name), seed)
        else:
            setattr(msg, field.name, _value(desc, field, seed, 0))
    return msg


def unset_fields(msg: Message, where: str = "") -> list[str]:
    """The fields of `msg` (nested too) left at their default: [] for a filled message."""
    missing: list[str] = []
    for field in msg.DESCRIPTOR.fields:
        path = f"{where}{field.name}"
        value = getattr(msg, field.name)
        if field.is_repeated:
            if len(value) == 0:
                missing.append(path)
            elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
                for i, item in enumerate(value):
                    missing.extend(unset_fields(item, f"{path}[{i}]."))
        elif field.message_type is not None:
            if not msg.HasField(field.name):
                missing.append(path)
            else:
                missing.extend(unset_fields(value, f"{path}."))
        elif value == field.default_value:
            missing.append(path)
    return missing
