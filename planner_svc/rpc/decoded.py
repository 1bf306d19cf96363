"""Request sub-messages as domain values, each distinct message converted (and checked) once.

A gateway asks about the same few models and the same inventory over and over, at contexts
and card counts that change; converting the model and the inventory (every number checked,
an inline shape rebuilt layer by layer) was a fifth of a fresh sizing's time. The domain
values are frozen, so one converted value serves every request whose sub-message has the
same bytes. Only conversions that succeed are kept (a refusal is raised again each time), and
only small messages, a bounded number of them: the memory held stays bounded whatever
requests arrive. An inline shape kept this way keeps its sizing memo too (the needs of the
profiles as they stand, `domain.fit.measure`), as a resolved source's shape does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from google.protobuf.message import Message

from llmgw.common.v1 import common_pb2
from llmgw.limits import DEFAULT_LIMITS, Limits
from llmgw.model import Inventory, Model
from llmgw.rpc import common

T = TypeVar("T")

KEPT_MESSAGES = 64
"""Converted values kept per kind of message (the least recently used go first)."""

KEPT_MESSAGE_BYTES = 4096
"""Messages longer than this (serialized) are converted every time, never kept: at most
KEPT_MESSAGES × 4 KiB of keys and their values per kind."""


class Decoded(Generic[T]):
    """A bounded memory of one conversion, keyed by the message's deterministic bytes."""

    def __init__(self, convert: Callable[[Message], T], limit: int = KEPT_MESSAGES) -> None:
        self._convert = convert
        self._limit = limit
        self._kept: OrderedDict[bytes, T] = OrderedDict()

    def __len__(self) -> int:
        """How many converted values are kept."""
        return len(self._kept)

    def __call__(self, msg: Message) -> T:
        """The message converted: the kept value for the same bytes, else converted now (and
        kept when small). A conversion that raises is not kept."""
        key = msg.SerializeToString(deterministic=True)
        value = self._kept.get(key)
        if value is not None:
            self._kept.move_to_end(key)
            return value
        value = self._convert(msg)
        if len(key) <= KEPT_MESSAGE_BYTES:
            self._kept[key] = value
            while len(self._kept) > self._limit:
                self._kept.popitem(last=False)
        return value


def _converters(
    limits: Limits,
) -> tuple[Callable[[Message], Model], Callable[[Message], Inventory]]:
    def model(msg: Message) -> Model:
        assert isinstance(msg, common_pb2.Model)
        return common.model_from_proto(msg, limits)

    def inventory(msg: Message) -> Inventory:
        assert isinstance(msg, common_pb2.Inventory)
        return common.inventory_from_proto(msg, limits)

    return model, inventory


def decoders(limits: Limits = DEFAULT_LIMITS) -> tuple[Decoded[Model], Decoded[Inventory]]:
    """A fresh pair of memories: models (`common.model_from_proto`) and inventories
    (`common.inventory_from_proto`), each checked against `limits`, one pair per servicer."""
    model, inventory = _converters(limits)
    return Decoded(model), Decoded(inventory)
