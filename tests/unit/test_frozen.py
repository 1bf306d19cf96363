"""`llmgw.frozen.made`: a frozen dataclass value equal to the one its __init__ makes, refused
where it would not be."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from llmgw.engines.base import CardNeed
from llmgw.frozen import made


@dataclass(frozen=True)
class _Pair:
    """Two fields, one defaulted."""

    a: int
    b: str = "x"


@dataclass(frozen=True)
class _Derived:
    """A value that derives a field in __post_init__."""

    a: int
    twice: int = field(default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "twice", 2 * self.a)


def test_made_equals_the_init_made_value_and_stays_frozen() -> None:
    """The value is equal to (and hashes as) `cls(**fields)`, and is as frozen."""
    value = made(_Pair, a=1, b="y")
    assert value == _Pair(1, "y") and hash(value) == hash(_Pair(1, "y"))
    assert type(value) is _Pair
    with pytest.raises(AttributeError):
        value.a = 2  # type: ignore[misc]
    need = dict(weights_bytes=1, kv_bytes=2, per_card_bytes=3, overhead_bytes=4)
    rest = dict(budget_bytes=5, cards=1, rules="r", devices=())
    full: dict[str, Any] = {f: 0 for f in CardNeed.__dataclass_fields__}
    full |= need | rest | {"weights_known": True}
    full["max_concurrency"] = 0.5
    assert made(CardNeed, **full) == CardNeed(**full)


def test_made_refuses_missing_or_unknown_fields_and_derived_classes() -> None:
    """A default left out, a name the class lacks, or a class whose __init__ derives fields is
    refused rather than made into a value that differs from its __init__'s."""
    with pytest.raises(TypeError, match=r"missing \['b'\]"):
        made(_Pair, a=1)
    with pytest.raises(TypeError, match=r"unknown \['c'\]"):
        made(_Pair, a=1, b="y", c=2)
    with pytest.raises(TypeError, match="__post_init__"):
        made(_Derived, a=1, twice=2)
