"""What sizing remembers per model shape, kept beside the shape rather than in it."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from llmgw.shape import ModelShape

_MEMOS: dict[int, dict[object, object]] = {}
"""Each live shape's memo, by the shape's identity; a shape's entry goes when the shape does."""


def sizing_memo(shape: ModelShape) -> dict[object, object]:
    """What sizing works out once per `shape` and setting, never per context (tensor parallel
    sizes, cache types, per-layer costs, an engine's overheads, fitted needs): a dict its
    callers keep bounded under their own keys. It lives exactly as long as `shape`: keyed by
    identity (hashing a shape would cost more than the work it saves, and two equal shapes
    simply work theirs out apart), it is dropped when the shape is collected, before its
    identity can be reused."""
    key = id(shape)
    try:
        return _MEMOS[key]
    except KeyError:
        memo = _MEMOS[key] = {}
        weakref.finalize(shape, _MEMOS.pop, key, None).atexit = False
        return memo


def memo_table(shape: ModelShape, name: str) -> OrderedDict[Hashable, Any]:
    """The table `name` of `shape`'s memo (made empty on first use): an OrderedDict its caller
    keeps in least-recently-used order and bounded."""
    memo = sizing_memo(shape)
    table = memo.get(name)
    if not isinstance(table, OrderedDict):
        table = memo[name] = OrderedDict()
    return table
