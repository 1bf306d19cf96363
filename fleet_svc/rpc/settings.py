"""The cluster settings file: models declared there are loaded and read-only via the API, and
who may do what (`roles:`, fleet_svc.domain.access.parse_roles).

Its `models:` are catalog models in the contract's JSON form, so they are read (and checked)
as the API reads them. The file is read strictly (llmgw.strict): a key it does not know, at any
depth of a model, is refused with its path and the nearest valid key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from fleet_svc.domain import errors
from fleet_svc.domain.access import DEFAULT_ROLES, Roles, parse_roles
from fleet_svc.domain.catalog import Entry
from fleet_svc.rpc.convert import accepted_entry
from llmgw import strict
from llmgw.common.v1 import common_pb2

SETTINGS_KEYS = ("roles", "models")
"""The settings file's top-level keys."""


def _load(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise errors.InvalidModel(
            f"cannot read the settings file {path}: {exc}", field="settings"
        ) from exc
    if not isinstance(data, dict):
        raise errors.InvalidModel(f"{path}: the settings file holds a mapping", field="settings")
    unknown = strict.unknown_keys(data, SETTINGS_KEYS)
    if unknown:
        raise errors.InvalidModel(f"{path}: {'; '.join(unknown)}", field="settings")
    return data


def read_roles(path: str | Path | None) -> Roles:
    """The roles a settings file gives; the defaults (fleet_svc.domain.access.DEFAULT_ROLES)
    when there is no file or it has no `roles:` section.

    Raises:
        InvalidModel: the file cannot be read or its `roles:` is malformed.
    """
    if not path:
        return DEFAULT_ROLES
    data = _load(path)
    if "roles" not in data:
        return DEFAULT_ROLES
    try:
        return parse_roles(data["roles"] or {}, source=str(path))
    except errors.InvalidModel as exc:
        raise errors.InvalidModel(f"{path}: {exc.message}", field=exc.field) from exc


def read_settings(path: str | Path) -> list[common_pb2.Model]:
    """The models a settings file declares (`models:` a list of catalog models).

    Raises:
        InvalidModel: the file cannot be read or a model in it is malformed.
    """
    data = _load(path)
    models = data.get("models") or []
    if not isinstance(models, list):
        raise errors.InvalidModel(f"{path}: `models` is a list of models", field="models")
    out = []
    for i, item in enumerate(models):
        unknown = strict.proto_unknown_keys(item, common_pb2.Model.DESCRIPTOR, f"models[{i}]")
        if unknown:
            raise errors.InvalidModel(f"{path}: {'; '.join(unknown)}", field=f"models[{i}]")
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
    return [accepted_entry(m) for m in read_settings(path)]
