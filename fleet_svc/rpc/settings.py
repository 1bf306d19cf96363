"""The cluster settings file: models declared there are loaded and read-only via the API.

Its `models:` are catalog models in the contract's JSON form, so they are read (and checked)
as the API reads them."""

from __future__ import annotations

from pathlib import Path

import yaml
from google.protobuf import json_format

from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Entry
from fleet_svc.rpc.convert import entry_in
from llmgw.common.v1 import common_pb2


def read_settings(path: str | Path) -> list[common_pb2.Model]:
    """The models a settings file declares (`models:` a list of catalog models).

    Raises:
        InvalidModel: the file cannot be read or a model in it is malformed.
    """
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise errors.InvalidModel(
            f"cannot read the settings file {path}: {exc}", field="settings"
        ) from exc
    if not isinstance(data, dict):
        raise errors.InvalidModel(f"{path}: the settings file holds a mapping", field="settings")
    models = data.get("models") or []
    if not isinstance(models, list):
        raise errors.InvalidModel(f"{path}: `models` is a list of models", field="models")
    out = []
    for i, item in enumerate(models):
        try:
            out.append(json_format.ParseDict(item, common_pb2.Model()))
        except json_format.ParseError as exc:
            raise errors.InvalidModel(f"{path}: models[{i}]: {exc}", field=f"models[{i}]") from exc
    return out


def declared_entries(path: str | Path) -> list[Entry]:
    """The models a settings file declares, checked as the API checks a new model.

    Raises:
        InvalidModel: the file cannot be read or a model in it is malformed.
    """
    return [entry_in(m) for m in read_settings(path)]
