"""The contract's messages to and from plain data, for callers that import no protos.

The contract's values are its protobuf messages here; the functions below are the one place
that turns plain data into them and back. A caller builds a model
or an inventory from the data a person wrote (YAML, flags), reads the answers' fields, and
prints them as JSON, all without importing the generated code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message as Message  # any answer, for code printing it

from llmgw import strict
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.planner.v1 import planner_pb2

# The messages callers hold (answers of the clients, values they send).
Model = common_pb2.Model
Profile = common_pb2.Profile
Inventory = common_pb2.Inventory
ContextChange = common_pb2.ContextChange
GPUsChange = common_pb2.GPUsChange
ModelShape = common_pb2.ModelShape
CatalogModel = fleet_pb2.CatalogModel
Replica = fleet_pb2.Replica
Node = fleet_pb2.Node
Rollout = fleet_pb2.Rollout
RolloutEvent = fleet_pb2.WatchRolloutResponse
ReplicaEvent = fleet_pb2.WatchReplicasResponse
DescribeModelAnswer = planner_pb2.DescribeModelResponse
SizeContextAnswer = planner_pb2.SizeContextResponse
BatchFit = planner_pb2.BatchFit
PlanGPUsAnswer = planner_pb2.PlanGPUsResponse
SetGPUsAnswer = fleet_pb2.SetGPUsResponse
SetContextAnswer = fleet_pb2.SetContextResponse


class InvalidValue(ValueError):
    """Data that is not a value of the contract (an unknown field, a wrong type)."""


def model_from_data(data: Mapping[str, Any]) -> Model:
    """A model from data in the catalog's shape (name, source, context_length, profiles[]
    {name, engine, args, gpu_class, gpus_per_node, replicas, ...}); proto or JSON field names.

    Raises:
        InvalidValue: a field is unknown or of the wrong type.
    """
    return _parse(data, common_pb2.Model())


def inventory_from_data(data: Mapping[str, Any]) -> Inventory:
    """An inventory from data of its shape: {nodes: [{name, gpu_class, gpus, free_gpus,
    gpu_memory_bytes}]}.

    Raises:
        InvalidValue: a field is unknown or of the wrong type.
    """
    return _parse(data, common_pb2.Inventory())


def model_data(model: Model) -> dict[str, Any]:
    """A model as plain data, for comparing two (unset fields left out)."""
    return json_format.MessageToDict(model)


def as_data(message: Message) -> dict[str, Any]:
    """A message as plain data, keyed by the proto's own field names (snake_case): the one
    convention of every `--json` the CLI prints, so a script reads `rollout_id` whichever
    command printed it. Fields at their default value are there too (`"replicas": 0`,
    `"args": []`), as kubectl prints them: a script need not know the defaults; a message
    field never set stays out (it has presence)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def as_json(message: Message, *, indent: int | None = 2) -> str:
    """A message as JSON text with the proto's field names and its default-valued fields, as
    `as_data` (`indent=None`: one line)."""
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=indent,
    )


def enum_name(message: Message, name: str) -> str:
    """The name of an enum field's value: `enum_name(replica, "phase")` -> REPLICA_PHASE_READY
    (the number itself for a value this code does not know)."""
    value = getattr(message, name)
    known = _enum_values(message, name).get(value)
    return known.name if known is not None else str(value)


def enum_names(message: Message, name: str) -> list[str]:
    """The names of a repeated enum field's values."""
    by_number = _enum_values(message, name)
    return [by_number[v].name if v in by_number else str(v) for v in getattr(message, name)]


def _enum_values(message: Message, name: str) -> Mapping[int, Any]:
    enum = message.DESCRIPTOR.fields_by_name[name].enum_type
    if enum is None:
        raise TypeError(f"{message.DESCRIPTOR.name}.{name} is not an enum field")
    return enum.values_by_number


MessageT = TypeVar("MessageT", bound=Message)


def _parse(data: Mapping[str, Any], into: MessageT) -> MessageT:
    if not isinstance(data, Mapping):
        raise InvalidValue(f"a {into.DESCRIPTOR.name} is a mapping, not {type(data).__name__}")
    unknown = strict.proto_unknown_keys(data, into.DESCRIPTOR)
    if unknown:
        raise InvalidValue("; ".join(unknown))
    try:
        return json_format.ParseDict(dict(data), into)
    except json_format.ParseError as exc:
        raise InvalidValue(str(exc)) from exc
