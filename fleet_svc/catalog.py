"""The catalog: models as revisions in the store, read-only where the settings file declares
them, and the profiles' wanted replicas for the controller."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf import json_format

from fleet_svc.domain import errors
from fleet_svc.domain.control import ProfileWant
from fleet_svc.domain.placement import Want
from fleet_svc.store.base import ModelRecord, StaleRevision, Store
from llmgw.common.v1 import common_pb2
from llmgw.model import InvalidValue
from llmgw.rpc.common import model_from_proto
from llmgw.shape import InvalidShape

log = structlog.get_logger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""Model names: DNS-label-like, so they are safe in URLs, metrics and file names."""
MAX_REPLICAS = 256


def spec_of(model: common_pb2.Model) -> dict[str, Any]:
    """A model as JSON-able data, as the store keeps it."""
    return json_format.MessageToDict(model, preserving_proto_field_name=True)


def model_of(record: ModelRecord) -> common_pb2.Model:
    """The model message of a stored revision."""
    return json_format.ParseDict(record.spec, common_pb2.Model(), ignore_unknown_fields=True)


def validate(model: common_pb2.Model) -> None:
    """Refuse a model the fleet could not run.

    Raises:
        InvalidModel: a bad name, profile or number.
    """
    if not NAME.match(model.name):
        raise errors.InvalidModel(
            f"model name {model.name!r} is not allowed: use 1-63 lower-case letters, digits, "
            "'.', '_' or '-', starting with a letter or digit",
            field="model.name",
        )
    try:
        model_from_proto(model)
    except (InvalidValue, InvalidShape) as exc:
        raise errors.InvalidModel(exc.message, field=getattr(exc, "field", "model")) from exc
    for i, p in enumerate(model.profiles):
        if not p.engine:
            raise errors.InvalidModel(
                f"profile {p.name!r} names no engine", field=f"model.profiles[{i}].engine"
            )
        if p.replicas > MAX_REPLICAS:
            raise errors.InvalidModel(
                f"profile {p.name!r} wants {p.replicas} replicas, more than {MAX_REPLICAS}",
                field=f"model.profiles[{i}].replicas",
            )


class Catalog:
    """Reads and writes the catalog; every change is a new revision with who and when."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self.declared: dict[str, str] = {}
        """Declared model name -> the settings file that declares it."""
        self.on_change: Callable[[], None] = lambda: None
        self._wants: list[ProfileWant] | None = None

    def get(self, name: str) -> ModelRecord:
        """The model's latest revision.

        Raises:
            ModelNotFound: absent or deleted.
        """
        record = self._store.get_model(name)
        if record is None:
            raise errors.ModelNotFound(f"no model {name!r} in the catalog", name=name)
        return record

    def all(self) -> list[ModelRecord]:
        """Every current model."""
        return self._store.list_models()

    def history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model.

        Raises:
            ModelNotFound: it never existed.
        """
        records = self._store.model_history(name)
        if not records:
            raise errors.ModelNotFound(f"no model {name!r} in the catalog", name=name)
        return records

    @staticmethod
    def spec(model: common_pb2.Model) -> dict[str, Any]:
        """A model as the store keeps it."""
        return spec_of(model)

    def check_writable(self, name: str) -> None:
        """Refuse a change of a declared model.

        Raises:
            ModelDeclared: the settings file declares it.
        """
        self._writable(name)

    def _writable(self, name: str) -> None:
        if name in self.declared:
            raise errors.ModelDeclared(
                f"model {name!r} is declared in the cluster settings ({self.declared[name]}): "
                "change it there",
                name=name,
                path=self.declared[name],
            )

    def _write(
        self,
        model: common_pb2.Model,
        by: str,
        expect: int,
        *,
        deleted: bool = False,
        declared_in: str = "",
    ) -> ModelRecord:
        record = ModelRecord(
            name=model.name,
            revision=expect + 1,
            spec=spec_of(model),
            updated_by=by,
            updated_at=self._clock(),
            deleted=deleted,
            declared_in=declared_in,
        )
        try:
            stored = self._store.put_model(record, expect_revision=expect)
        except StaleRevision as exc:
            raise errors.StaleRevision(
                f"model {model.name!r} changed since it was read (now revision {exc.current}): "
                "read it again and retry",
                name=model.name,
                expected=str(expect),
                current=exc.current,
            ) from exc
        log.info(
            "model_written", model=model.name, revision=stored.revision, by=by, deleted=deleted
        )
        self._wants = None
        self.on_change()
        return stored

    @staticmethod
    def _expect(record: ModelRecord, etag: str) -> int:
        if etag and etag != str(record.revision):
            raise errors.StaleRevision(
                f"model {record.name!r} is at revision {record.revision}, not {etag}: read it "
                "again and retry",
                name=record.name,
                expected=etag,
                current=record.revision,
            )
        return record.revision

    def create(self, model: common_pb2.Model, by: str) -> ModelRecord:
        """Add a model.

        Raises:
            InvalidModel, ModelExists, ModelDeclared.
        """
        validate(model)
        self._writable(model.name)
        if self._store.get_model(model.name) is not None:
            raise errors.ModelExists(
                f"model {model.name!r} is in the catalog already: update it instead",
                name=model.name,
            )
        history = self._store.model_history(model.name)
        return self._write(model, by, history[-1].revision if history else 0)

    def update(self, model: common_pb2.Model, etag: str, by: str) -> ModelRecord:
        """Replace a model, guarded by its etag (empty: unguarded).

        Raises:
            InvalidModel, ModelNotFound, ModelDeclared, StaleRevision.
        """
        validate(model)
        self._writable(model.name)
        current = self.get(model.name)
        return self._write(model, by, self._expect(current, etag))

    def delete(self, name: str, etag: str, by: str) -> ModelRecord:
        """Remove a model (its replicas are stopped).

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision.
        """
        self._writable(name)
        current = self.get(name)
        return self._write(model_of(current), by, self._expect(current, etag), deleted=True)

    def declare(self, models: list[common_pb2.Model], path: str) -> None:
        """Load the models the settings file declares: written as a new revision when they
        differ from what is stored, and read-only through the API from now on.

        Raises:
            InvalidModel: a declared model is malformed (the fleet does not start).
        """
        for model in models:
            validate(model)
            current = self._store.get_model(model.name)
            if current is None or current.spec != spec_of(model) or current.declared_in != path:
                history = self._store.model_history(model.name)
                self._write(
                    model,
                    f"settings:{path}",
                    history[-1].revision if history else 0,
                    declared_in=path,
                )
            self.declared[model.name] = path

    def wants(self) -> list[ProfileWant]:
        """Every profile's wanted replicas, for the controller (kept until the catalog changes:
        the controller asks every tick)."""
        if self._wants is None:
            self._wants = self._read_wants()
        return list(self._wants)

    def _read_wants(self) -> list[ProfileWant]:
        out = []
        for record in self._store.list_models():
            model = model_of(record)
            for p in model.profiles:
                cards = max(p.gpus_per_node, p.tp, 1)
                on_cpu = p.cpu_only or not p.gpu_class
                out.append(
                    ProfileWant(
                        model=model.name,
                        profile=p.name,
                        revision=record.revision,
                        replicas=p.replicas,
                        want=Want(
                            gpu_class="" if on_cpu else p.gpu_class,
                            gpus=0 if on_cpu else cards,
                            ram_bytes=p.min_memory_gb * 1_000_000_000 if on_cpu else 0,
                        ),
                        spec={
                            "model": model.name,
                            "profile": p.name,
                            "engine": p.engine,
                            "args": list(p.args),
                            "source": model.source,
                        },
                    )
                )
        return out
