"""Strict reading of hand-written files (the agent config, the cluster settings, model files):
an unknown key or a value of the wrong type is refused, the message naming the key's path and
the nearest valid key (`restart.cap: unknown key; did you mean cap_s?`), so a typo does not
pass silently as a default.

Suggestions are difflib's closest match above its usual 0.6 ratio. `proto_unknown_keys`
walks data in a protobuf message's JSON form against the message's descriptor (passed in: this
module imports no generated code), field names and their JSON names both accepted, as
`json_format.ParseDict` accepts them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

SUGGEST_CUTOFF = 0.6
"""How close a key must be to a valid one to be suggested (difflib's default ratio)."""


def nearest(key: str, known: Iterable[str]) -> str | None:
    """The valid key `key` most likely meant, if one is close."""
    found = difflib.get_close_matches(str(key), sorted(set(known)), n=1, cutoff=SUGGEST_CUTOFF)
    return found[0] if found else None


def join(where: str, key: object) -> str:
    """A key's path: `restart` + `cap` -> `restart.cap`; a list index as `[i]`."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def unknown_key(path: str, key: object, known: Iterable[str]) -> str:
    """The message for one unknown key at `path`."""
    names = sorted(set(known))
    guess = nearest(str(key), names)
    hint = f"did you mean {guess}?" if guess else f"known: {', '.join(names)}"
    return f"{join(path, key)}: unknown key; {hint}"


def unknown_keys(data: Mapping[Any, Any], known: Iterable[str], path: str = "") -> list[str]:
    """A message per key of `data` not in `known` (empty: none)."""
    names = set(known)
    return [unknown_key(path, k, names) for k in data if k not in names]


def wrong_type(path: str, want: str, value: object) -> str:
    """The message for a value of the wrong type: `restart.max_crashes: want a whole number,
    not str 'five'`."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{path}: want {want}, not {type(value).__name__} {shown}"


_MESSAGE = 11
"""FieldDescriptor.TYPE_MESSAGE."""


def proto_unknown_keys(data: Any, descriptor: Any, path: str = "") -> list[str]:
    """Messages for every key in `data` (a message's JSON form, nested) that its message
    `descriptor` has no field for; maps and well-known types (a Struct, a Timestamp) are not
    walked into."""
    if not isinstance(data, Mapping) or descriptor.GetOptions().map_entry:
        return []
    if descriptor.full_name.startswith("google.protobuf."):
        return []
    fields: dict[str, Any] = {}
    for f in descriptor.fields:
        fields[f.name] = f
        fields[f.json_name] = f
    out: list[str] = []
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            out.append(unknown_key(path, key, [f.name for f in descriptor.fields]))
            continue
        if field.type != _MESSAGE:
            continue
        where = join(path, key)
        if isinstance(value, list):
            for i, item in enumerate(value):
                out.extend(proto_unknown_keys(item, field.message_type, f"{where}[{i}]"))
        else:
            out.extend(proto_unknown_keys(value, field.message_type, where))
    return out
