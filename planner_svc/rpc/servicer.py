"""The PlannerService servicer: requests to domain calls, answers and refusals back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol, TypeAlias

import grpc
import structlog

from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.domain import errors
from planner_svc.domain.context import check_context_request, size_context
from planner_svc.domain.gpus import plan_gpus
from planner_svc.domain.llamacpp import LLAMACPP_VERSION
from planner_svc.domain.model import Model
from planner_svc.domain.shape import ModelShape
from planner_svc.rpc import convert
from planner_svc.rpc.status import refusals_as_status

log = structlog.get_logger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class Resolver(Protocol):
    """What the servicer needs of a shape resolver."""

    async def resolve(self, source: str, files: Any = ()) -> ModelShape:
        """The shape of the model at `source`."""


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    """Answers SizeContext, PlanGPUs and DescribeModel."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    async def _shape_of(self, model: Model) -> tuple[ModelShape | None, str]:
        """A model's shape and, when it could not be read, a note saying so.

        A source that cannot be reached leaves the change to go ahead unchecked (as the
        reference does); a malformed header or config is refused (InvalidShape), since the
        engine would not load it either.
        """
        if model.shape is not None:
            shape = model.shape
        elif not model.source:
            return None, "where it came from is not known, so the memory it needs is not checked"
        else:
            try:
                shape = await self._resolver.resolve(model.source, model.files)
            except errors.SourceUnreachable as exc:
                log.info(
                    "shape_unreadable", model=model.name, source=model.source, error=exc.message
                )
                return None, (
                    f"its shape could not be read ({exc.message}), so the memory it needs is not "
                    "checked"
                )
        if shape.weights_bytes <= 0 and model.files_bytes > 0:
            shape = replace(shape, weights_bytes=model.files_bytes)
        return shape, ""

    @refusals_as_status
    async def SizeContext(
        self, request: planner_pb2.SizeContextRequest, context: Context
    ) -> planner_pb2.SizeContextResponse:
        """A new context for a model: each profile's engine arguments and memory."""
        model = convert.model_from_proto(request.model)
        check_context_request(request.tokens, request.slots)
        inventory = convert.inventory_from_proto(request.inventory)
        shape, note = await self._shape_of(model)
        change = size_context(
            model, shape, tokens=request.tokens, slots=request.slots, inventory=inventory, note=note
        )
        log.info("context_sized", model=model.name, before=change.before, after=change.after)
        return planner_pb2.SizeContextResponse(
            change=convert.context_change_to_proto(change),
            profiles=[convert.profile_to_proto(p) for p in change.updated],
            llamacpp_version=LLAMACPP_VERSION,
        )

    @refusals_as_status
    async def PlanGPUs(
        self, request: planner_pb2.PlanGPUsRequest, context: Context
    ) -> planner_pb2.PlanGPUsResponse:
        """N cards of one node per replica for one profile or every GPU profile."""
        model = convert.model_from_proto(request.model)
        inventory = convert.inventory_from_proto(request.inventory)
        shape, note = await self._shape_of(model)
        change = plan_gpus(
            model,
            shape,
            gpus=request.gpus,
            profile=request.profile,
            inventory=inventory,
            note=note,
        )
        log.info("gpus_planned", model=model.name, gpus=change.gpus)
        return planner_pb2.PlanGPUsResponse(
            change=convert.gpus_change_to_proto(change),
            profiles=[convert.profile_to_proto(p) for p in change.updated],
            llamacpp_version=LLAMACPP_VERSION,
        )

    @refusals_as_status
    async def DescribeModel(
        self, request: planner_pb2.DescribeModelRequest, context: Context
    ) -> planner_pb2.DescribeModelResponse:
        """The resolved shape of a model's source."""
        if not request.source:
            raise errors.InvalidRequest(
                "the request names no source: give a GGUF URL or path, or hf://ORG/NAME",
                field="source",
            )
        files = tuple((f.path, f.bytes) for f in request.origin.files)
        shape = await self._resolver.resolve(request.source, files)
        files_bytes = sum(size for _, size in files)
        if shape.weights_bytes <= 0 and files_bytes > 0:
            shape = replace(shape, weights_bytes=files_bytes)
        return planner_pb2.DescribeModelResponse(
            shape=convert.shape_to_proto(shape), llamacpp_version=LLAMACPP_VERSION
        )
