"""Catalog revisions to and from the store's rows.

A row keeps a model as the JSON form of `llmgw.common.v1.Model` (proto field names; defaults
left out; int64 numbers as strings), as protobuf's JSON mapping writes it: existing databases
load unchanged, and the file stays readable by any proto tool. The fields are walked from the
typed model's own (`llmgw.model.scalar_fields`), so no field list is kept here and the fleet's
core needs no generated code; tests/unit/test_catalog_rows.py checks it against protobuf's own
mapping, tests/integration/test_field_round_trip.py walks every proto field through it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fleet_svc.domain.catalog import Entry, Revision
from fleet_svc.store.base import ModelRecord
from llmgw.model import Model, Profile, check_nested, scalar_fields

_MODEL_NESTED = frozenset({"files", "profiles", "shape"})
"""Model's fields laid out below by hand (the origin's files, the profiles, the inline shape);
every other field is a scalar written by `_scalars_doc`, so a new one is kept unasked."""
check_nested(Model, _MODEL_NESTED, __name__)
check_nested(Profile, frozenset(), __name__)


def _int(value: object) -> int:
    """An integer from its JSON form (int64 numbers are strings there)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str | float):
        return int(value)
    return 0


def _scalars_doc(value: object) -> dict[str, Any]:
    """The scalar fields of a contract value in their JSON form: defaults left out, int64
    numbers as strings, lists as lists (protobuf's JSON mapping)."""
    doc: dict[str, Any] = {}
    for s in scalar_fields(type(value))[0]:
        v = getattr(value, s.name)
        if not v:
            continue
        if s.kind is tuple:
            doc[s.name] = list(v)
        elif s.int64:
            doc[s.name] = str(v)
        else:
            doc[s.name] = v
    return doc


def _scalars_of_doc(cls: type, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar fields of `cls` read from their JSON form (absent: the default; unknown
    keys ignored), as keyword arguments."""
    out: dict[str, Any] = {}
    for s in scalar_fields(cls)[0]:
        if s.name not in doc:
            continue
        raw = doc[s.name]
        if s.kind is tuple:
            out[s.name] = tuple(str(a) for a in raw) if isinstance(raw, list) else ()
        elif s.kind is int:
            out[s.name] = _int(raw)
        elif s.kind is bool:
            out[s.name] = bool(raw)
        else:
            out[s.name] = str(raw)
    return out


def profile_doc(p: Profile) -> dict[str, Any]:
    """A profile in the JSON form of `llmgw.common.v1.Profile`."""
    return _scalars_doc(p)


def profile_of_doc(doc: Mapping[str, Any]) -> Profile:
    """A profile from its JSON form (unknown keys ignored)."""
    return Profile(**_scalars_of_doc(Profile, doc))


def entry_doc(entry: Entry) -> dict[str, Any]:
    """A catalog entry in the JSON form of `llmgw.common.v1.Model`."""
    m = entry.model
    doc = _scalars_doc(m)
    origin: dict[str, Any] = {}
    if entry.origin_repo:
        origin["repo"] = entry.origin_repo
    if entry.origin_revision:
        origin["revision"] = entry.origin_revision
    if m.files:
        files = []
        for path, size in m.files:
            f: dict[str, Any] = {}
            if path:
                f["path"] = path
            if size:
                f["bytes"] = str(size)
            files.append(f)
        origin["files"] = files
    if origin:
        doc["origin"] = origin
    if m.profiles:
        doc["profiles"] = [profile_doc(p) for p in m.profiles]
    if entry.shape is not None:
        doc["shape"] = dict(entry.shape)
    return doc


def entry_of_doc(doc: Mapping[str, Any]) -> Entry:
    """A catalog entry from its JSON form (unknown keys ignored, as the store's rows were
    written by the fleet after checking them)."""
    origin = doc.get("origin") or {}
    files = tuple(
        (str(f.get("path", "")), _int(f.get("bytes", 0))) for f in origin.get("files", ())
    )
    shape = doc.get("shape")
    return Entry(
        model=Model(
            **_scalars_of_doc(Model, doc),
            files=files,
            profiles=tuple(profile_of_doc(p) for p in doc.get("profiles", ())),
        ),
        origin_repo=str(origin.get("repo", "")),
        origin_revision=str(origin.get("revision", "")),
        shape=dict(shape) if isinstance(shape, Mapping) else None,
    )


def etag_of(entry: Entry) -> str:
    """A catalog entry's etag: SHA-256 of its JSON form (`entry_doc`) with sorted keys and no
    spaces, first 24 hex digits (96 bits). Equal content, equal etag, whatever its revision;
    opaque to callers, who only send it back."""
    canonical = json.dumps(entry_doc(entry), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def revision_of(record: ModelRecord) -> Revision:
    """A stored row as a catalog revision (its etag derived from its content)."""
    entry = entry_of_doc(record.spec)
    return Revision(
        entry=entry,
        etag=etag_of(entry),
        revision=record.revision,
        updated_by=record.updated_by,
        updated_at=record.updated_at,
        deleted=record.deleted,
        declared_in=record.declared_in,
    )


def record_of(rev: Revision) -> ModelRecord:
    """A catalog revision as a row to store."""
    return ModelRecord(
        name=rev.name,
        revision=rev.revision,
        spec=entry_doc(rev.entry),
        updated_by=rev.updated_by,
        updated_at=rev.updated_at,
        deleted=rev.deleted,
        declared_in=rev.declared_in,
    )
