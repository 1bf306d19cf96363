"""The FleetService servicer: catalog RPCs, nodes, replicas and the endpoint stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.rpc import convert
from fleet_svc.rpc.status import refusals_as_status
from fleet_svc.store.base import Store
from fleet_svc.watch import SYNCED, WatcherTooSlow
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

log = structlog.get_logger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
CALLER_KEY = "x-llmgw-caller"
"""Metadata naming the person or system behind a call, for the audit trail."""

M = TypeVar("M", bound=Message)


def caller_of(context: Context) -> str:
    """Who makes a call: the mTLS identity when there is one, else the caller metadata,
    else the peer address."""
    auth = context.auth_context() or {}
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        names = list(auth.get(key) or ())
        if names:
            return bytes(names[0]).decode()
    for key, value in context.invocation_metadata() or ():
        if key == CALLER_KEY and value:
            return str(value)
    return f"anonymous@{context.peer()}"


class FleetServicer(fleet_pb2_grpc.FleetServiceServicer):
    """Serves the fleet's API over the catalog, the store and the controller."""

    def __init__(
        self, catalog: Catalog, store: Store, controller: Controller, clock: Callable[[], float]
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._controller = controller
        self._clock = clock

    async def _once(
        self, request_id: str, method: str, response: type[M], make: Callable[[], Awaitable[M]]
    ) -> M:
        """Answer a mutation once per request id: a retry gets the first answer."""
        if request_id:
            stored = self._store.get_answer(request_id)
            if stored is not None:
                first_method, blob = stored
                if first_method != method:
                    raise errors.RequestIdReused(
                        f"request id {request_id!r} was used for {first_method}: use a new id",
                        request_id=request_id,
                        method=first_method,
                    )
                log.info("request_replayed", method=method, request_id=request_id)
                return response.FromString(blob)
        answer = await make()
        if request_id:
            self._store.put_answer(request_id, method, answer.SerializeToString())
        return answer

    @refusals_as_status
    async def CreateModel(
        self, request: fleet_pb2.CreateModelRequest, context: Context
    ) -> fleet_pb2.CreateModelResponse:
        """Add a model."""

        async def make() -> fleet_pb2.CreateModelResponse:
            record = self._catalog.create(request.model, caller_of(context))
            return fleet_pb2.CreateModelResponse(model=convert.catalog_model(record))

        return await self._once(
            request.request_id, "CreateModel", fleet_pb2.CreateModelResponse, make
        )

    @refusals_as_status
    async def GetModel(
        self, request: fleet_pb2.GetModelRequest, context: Context
    ) -> fleet_pb2.GetModelResponse:
        """One model with its etag."""
        return fleet_pb2.GetModelResponse(
            model=convert.catalog_model(self._catalog.get(request.name))
        )

    @refusals_as_status
    async def ListModels(
        self, request: fleet_pb2.ListModelsRequest, context: Context
    ) -> fleet_pb2.ListModelsResponse:
        """The catalog."""
        return fleet_pb2.ListModelsResponse(
            models=[convert.catalog_model(r) for r in self._catalog.all()]
        )

    @refusals_as_status
    async def UpdateModel(
        self, request: fleet_pb2.UpdateModelRequest, context: Context
    ) -> fleet_pb2.UpdateModelResponse:
        """Replace a model, guarded by its etag."""

        async def make() -> fleet_pb2.UpdateModelResponse:
            record = self._catalog.update(request.model, request.etag, caller_of(context))
            return fleet_pb2.UpdateModelResponse(model=convert.catalog_model(record))

        return await self._once(
            request.request_id, "UpdateModel", fleet_pb2.UpdateModelResponse, make
        )

    @refusals_as_status
    async def DeleteModel(
        self, request: fleet_pb2.DeleteModelRequest, context: Context
    ) -> fleet_pb2.DeleteModelResponse:
        """Remove a model; its replicas are drained and stopped."""

        async def make() -> fleet_pb2.DeleteModelResponse:
            record = self._catalog.delete(request.name, request.etag, caller_of(context))
            return fleet_pb2.DeleteModelResponse(model=convert.catalog_model(record))

        return await self._once(
            request.request_id, "DeleteModel", fleet_pb2.DeleteModelResponse, make
        )

    @refusals_as_status
    async def ListModelRevisions(
        self, request: fleet_pb2.ListModelRevisionsRequest, context: Context
    ) -> fleet_pb2.ListModelRevisionsResponse:
        """A model's history."""
        return fleet_pb2.ListModelRevisionsResponse(
            revisions=[convert.catalog_model(r) for r in self._catalog.history(request.name)]
        )

    @refusals_as_status
    async def ListNodes(
        self, request: fleet_pb2.ListNodesRequest, context: Context
    ) -> fleet_pb2.ListNodesResponse:
        """The nodes and their phases."""
        state = self._controller.state
        replicas = list(state.replicas.values())
        return fleet_pb2.ListNodesResponse(
            nodes=[
                convert.node(v, replicas, v.last_heard_s)
                for v in sorted(state.nodes.values(), key=lambda v: v.name)
            ]
        )

    @refusals_as_status
    async def ListReplicas(
        self, request: fleet_pb2.ListReplicasRequest, context: Context
    ) -> fleet_pb2.ListReplicasResponse:
        """The replicas, their phases and why."""
        if request.model:
            self._catalog.get(request.model)
        replicas = sorted(
            (
                r
                for r in self._controller.state.replicas.values()
                if not request.model or r.model == request.model
            ),
            key=lambda r: (r.model, r.profile, r.id),
        )
        return fleet_pb2.ListReplicasResponse(replicas=[convert.replica(r) for r in replicas])

    async def WatchReplicas(
        self, request: fleet_pb2.WatchReplicasRequest, context: Context
    ) -> AsyncIterator[fleet_pb2.WatchReplicasResponse]:
        """Ready endpoints: a snapshot, SYNCED, then additions and removals as they happen."""
        try:
            async for event in self._controller.hub.watch(request.model):
                yield convert.endpoint_event(event, event is SYNCED)
        except WatcherTooSlow as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
