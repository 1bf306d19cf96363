"""Catalog revisions to and from the store's rows.

A row keeps a model as the JSON form of `llmgw.common.v1.Model` (proto field names; defaults
left out; int64 numbers as strings), as protobuf's JSON mapping writes it: existing databases
load unchanged, and the file stays readable by any proto tool. Written here by hand, so the
fleet's core needs no generated code; tests/unit/test_catalog_rows.py checks it against
protobuf's own mapping.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fleet_svc.domain.catalog import Entry, Revision
from fleet_svc.store.base import ModelRecord
from llmgw.model import Model, Profile

# Profile fields as proto numbers (int32) and their defaults, in field order.
_PROFILE_INTS = ("gpus_per_node", "tp", "pp", "nodes", "min_memory_gb")


def _int(value: object) -> int:
    """An integer from its JSON form (int64 numbers are strings there)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str | float):
        return int(value)
    return 0


def profile_doc(p: Profile) -> dict[str, Any]:
    """A profile in the JSON form of `llmgw.common.v1.Profile`."""
    doc: dict[str, Any] = {}
    if p.name:
        doc["name"] = p.name
    if p.engine:
        doc["engine"] = p.engine
    if p.args:
        doc["args"] = list(p.args)
    if p.gpu_class:
        doc["gpu_class"] = p.gpu_class
    for key in _PROFILE_INTS:
        if getattr(p, key):
            doc[key] = getattr(p, key)
    if p.cpu_only:
        doc["cpu_only"] = True
    if p.replicas:
        doc["replicas"] = p.replicas
    return doc


def profile_of_doc(doc: Mapping[str, Any]) -> Profile:
    """A profile from its JSON form (unknown keys ignored)."""
    return Profile(
        name=str(doc.get("name", "")),
        engine=str(doc.get("engine", "")),
        args=tuple(str(a) for a in doc.get("args", ())),
        gpu_class=str(doc.get("gpu_class", "")),
        gpus_per_node=_int(doc.get("gpus_per_node", 0)),
        tp=_int(doc.get("tp", 0)),
        pp=_int(doc.get("pp", 0)),
        nodes=_int(doc.get("nodes", 0)),
        min_memory_gb=_int(doc.get("min_memory_gb", 0)),
        cpu_only=bool(doc.get("cpu_only", False)),
        replicas=_int(doc.get("replicas", 0)),
    )


def entry_doc(entry: Entry) -> dict[str, Any]:
    """A catalog entry in the JSON form of `llmgw.common.v1.Model`."""
    m = entry.model
    doc: dict[str, Any] = {}
    if m.name:
        doc["name"] = m.name
    if m.source:
        doc["source"] = m.source
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
    if m.context_length:
        doc["context_length"] = str(m.context_length)
    if m.max_output:
        doc["max_output"] = str(m.max_output)
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
            name=str(doc.get("name", "")),
            source=str(doc.get("source", "")),
            files=files,
            context_length=_int(doc.get("context_length", 0)),
            max_output=_int(doc.get("max_output", 0)),
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
