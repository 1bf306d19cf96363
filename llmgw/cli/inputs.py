"""What a person hands `llmgw`: a model file (YAML or JSON, the catalog's shape), a model made
from flags, an inventory from --node flags or a file. Each becomes the contract's value or a
`UsageError` saying what is wrong with it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml

from llmgw.cli.common import GIB, UsageError
from llmgw.clients.convert import (
    InvalidValue,
    Inventory,
    Model,
    inventory_from_data,
    model_from_data,
)

_NODE = re.compile(
    r"^(?:(?P<count>\d+)x)?(?P<cls>[A-Za-z0-9._-]+?)(?::(?P<mem>\d+(?:\.\d+)?)GiB)?$"
)


def _model_file_data(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read it as YAML or JSON ({exc})") from exc


def _model(data: dict[str, Any], where: str) -> Model:
    try:
        return model_from_data(data)
    except InvalidValue as exc:
        raise UsageError(f"{where}: {exc}") from exc


def model_of_data(data: Any, where: str) -> Model:
    """A catalog model from data read out of `where` (a mapping in the catalog's shape,
    optionally under a top-level `model:` key).

    Raises:
        UsageError: the data is not one model.
    """
    if isinstance(data, dict) and set(data) == {"model"} and isinstance(data["model"], dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a model file holds one mapping (name, source, profiles)")
    return _model(data, where)


def read_model_file(path: str) -> Model:
    """A catalog model from a YAML or JSON file (the shape of `llmgw.common.v1.Model`: name,
    source, context_length, profiles[] {name, engine, args, gpu_class, gpus_per_node,
    replicas, ...}), optionally under a top-level `model:` key.

    Raises:
        UsageError: the file cannot be read or is not one model.
    """
    return model_of_data(_model_file_data(path), path)


def model_from_args(opts: argparse.Namespace) -> Model:
    """The model of a planner request: a YAML/JSON file in the catalog's shape, or a source
    with one profile made from the flags.

    Raises:
        UsageError: the file cannot be read or is not one model.
    """
    spec = opts.model
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        data = _model_file_data(spec)
        if not isinstance(data, dict):
            raise UsageError(f"{spec}: a model file holds one mapping (name, source, profiles)")
        return _model(data, spec)
    profile = {
        "name": opts.profile or "default",
        "engine": opts.engine,
        "args": list(opts.arg or []),
        "gpu_class": "" if opts.cpu else opts.gpu_class,
        "gpus_per_node": opts.cards if not opts.cpu else 0,
        "cpu_only": opts.cpu,
    }
    name = opts.name or spec.rstrip("/").rsplit("/", 1)[-1]
    return _model(
        {
            "name": name,
            "source": spec,
            "context_length": opts.context or 0,
            "profiles": [profile],
        },
        "the flags",
    )


def node_from_text(text: str, index: int) -> dict[str, Any]:
    """An inventory node, as data, from `8xH100-80GB` (or `8xH100-80GB:79.6GiB` with the card
    memory).

    Raises:
        UsageError: the text is not COUNTxCLASS[:MEMGiB].
    """
    match = _NODE.match(text.strip())
    if not match:
        raise UsageError(f"--node {text!r}: write COUNTxCLASS, e.g. 8xH100-80GB[:79.6GiB]")
    count = int(match.group("count") or 1)
    mem = match.group("mem")
    return {
        "name": f"node-{index}",
        "gpu_class": match.group("cls"),
        "gpus": count,
        "free_gpus": count,
        "gpu_memory_bytes": int(float(mem) * GIB) if mem else 0,
    }


def inventory_from_args(opts: argparse.Namespace) -> Inventory:
    """The inventory of a planner request, from --node flags or an --inventory file.

    Raises:
        UsageError: a --node is malformed, or the file cannot be read as an inventory.
    """
    if opts.inventory:
        try:
            data = yaml.safe_load(Path(opts.inventory).read_text())
            return inventory_from_data(data)
        except (OSError, yaml.YAMLError, InvalidValue) as exc:
            raise UsageError(f"--inventory {opts.inventory}: {exc}") from exc
    return inventory_from_data(
        {"nodes": [node_from_text(t, i) for i, t in enumerate(opts.node or [])]}
    )
