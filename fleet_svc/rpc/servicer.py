"""The FleetService servicer: catalog RPCs, nodes, replicas and the endpoint stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from fleet_svc.catalog import Catalog
from fleet_svc.changes import Changes
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.rollout import Rollout, RolloutState
from fleet_svc.rollouts import load_rollout
from fleet_svc.rpc import convert
from fleet_svc.rpc.status import refusals_as_status
from fleet_svc.store.base import Store
from fleet_svc.watch import SYNCED, WatcherTooSlow
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.planner.v1 import planner_pb2

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


class CatalogServicer(fleet_pb2_grpc.FleetServiceServicer):
    """The catalog, node and replica RPCs."""

    def __init__(
        self,
        catalog: Catalog,
        store: Store,
        controller: Controller,
        changes: Changes,
        clock: Callable[[], float],
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._controller = controller
        self._changes = changes
        self._clock = clock

    def _not_rolling_out(self, name: str) -> None:
        """Refuse a catalog write while the model rolls out."""
        running = self._controller.running_rollout(name)
        if running is not None:
            raise errors.RolloutInProgress(
                f"model {name!r} is rolling out {running.id}: wait for it or cancel it first",
                name=name,
                rollout_id=running.id,
            )

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
            self._not_rolling_out(request.model.name)
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
            self._not_rolling_out(request.name)
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


class FleetServicer(CatalogServicer):
    """Serves the fleet's whole API: the catalog, SetContext, SetGPUs and rollouts."""

    def _rollout(self, rollout_id: str) -> Rollout:
        running = self._controller.rollouts.get(rollout_id)
        if running is not None:
            return running
        rec = self._store.get_rollout(rollout_id)
        if rec is None:
            raise errors.RolloutNotFound(f"no rollout {rollout_id!r}", rollout_id=rollout_id)
        return load_rollout(rec)

    def _undo_available(self, ro: Rollout) -> bool:
        if not ro.done or (ro.state is RolloutState.SUCCEEDED and ro.kind == "undo"):
            return False
        try:
            return self._catalog.get(ro.model).revision == ro.to_revision
        except errors.ModelNotFound:
            return False

    @refusals_as_status
    async def SetContext(
        self, request: fleet_pb2.SetContextRequest, context: Context
    ) -> fleet_pb2.SetContextResponse:
        """A new context: planner, catalog, rollout."""

        async def make() -> fleet_pb2.SetContextResponse:
            answer, applied = await self._changes.set_context(
                planner_pb2.SizeContextRequest(
                    model=common_pb2.Model(name=request.name),
                    tokens=request.tokens,
                    slots=request.slots,
                ),
                etag=request.etag,
                by=caller_of(context),
                dry_run=request.dry_run,
                strategy=convert.strategy_of(request.strategy),
                supersede=request.supersede,
                surge=request.surge,
            )
            return fleet_pb2.SetContextResponse(
                change=answer.change,
                rollout_id=applied.rollout_id,
                model=convert.catalog_model(applied.record),
            )

        if request.dry_run:
            return await make()
        return await self._once(
            request.request_id, "SetContext", fleet_pb2.SetContextResponse, make
        )

    @refusals_as_status
    async def SetGPUs(
        self, request: fleet_pb2.SetGPUsRequest, context: Context
    ) -> fleet_pb2.SetGPUsResponse:
        """N cards a replica: planner, catalog, rollout."""

        async def make() -> fleet_pb2.SetGPUsResponse:
            answer, applied = await self._changes.set_gpus(
                planner_pb2.PlanGPUsRequest(
                    model=common_pb2.Model(name=request.name),
                    gpus=request.gpus,
                    profile=request.profile,
                ),
                etag=request.etag,
                by=caller_of(context),
                dry_run=request.dry_run,
                strategy=convert.strategy_of(request.strategy, request.in_place),
                supersede=request.supersede,
                surge=request.surge,
            )
            return fleet_pb2.SetGPUsResponse(
                change=answer.change,
                rollout_id=applied.rollout_id,
                model=convert.catalog_model(applied.record),
            )

        if request.dry_run:
            return await make()
        return await self._once(request.request_id, "SetGPUs", fleet_pb2.SetGPUsResponse, make)

    @refusals_as_status
    async def GetRollout(
        self, request: fleet_pb2.GetRolloutRequest, context: Context
    ) -> fleet_pb2.GetRolloutResponse:
        """One rollout."""
        ro = self._rollout(request.id)
        return fleet_pb2.GetRolloutResponse(rollout=convert.rollout(ro, self._undo_available(ro)))

    @refusals_as_status
    async def ListRollouts(
        self, request: fleet_pb2.ListRolloutsRequest, context: Context
    ) -> fleet_pb2.ListRolloutsResponse:
        """Rollouts, newest first."""
        out = []
        for rec in self._store.list_rollouts(request.model):
            ro = self._controller.rollouts.get(rec.id) or load_rollout(rec)
            out.append(convert.rollout(ro, self._undo_available(ro)))
        return fleet_pb2.ListRolloutsResponse(rollouts=out)

    async def WatchRollout(
        self, request: fleet_pb2.WatchRolloutRequest, context: Context
    ) -> AsyncIterator[fleet_pb2.WatchRolloutResponse]:
        """A rollout's events after `after_seq`, then live ones until it ends."""
        if self._store.get_rollout(request.id) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no rollout {request.id!r}")
            return
        seq = max(request.after_seq, 0)
        while True:
            signal = self._controller.rollout_signal
            for event in self._store.list_events(request.id, seq):
                seq = event.seq
                yield convert.rollout_event(event)
            if request.id not in self._controller.rollouts:
                # Ended: every event is stored before the rollout leaves the running set.
                for event in self._store.list_events(request.id, seq):
                    seq = event.seq
                    yield convert.rollout_event(event)
                return
            await signal.wait()

    @refusals_as_status
    async def CancelRollout(
        self, request: fleet_pb2.CancelRolloutRequest, context: Context
    ) -> fleet_pb2.CancelRolloutResponse:
        """Stop a running rollout; old replicas keep serving."""

        async def make() -> fleet_pb2.CancelRolloutResponse:
            ro = self._rollout(request.id)
            if not ro.done:
                ended = self._controller.cancel(ro.id, f"cancelled by {caller_of(context)}")
                ro = ended or ro
            return fleet_pb2.CancelRolloutResponse(
                rollout=convert.rollout(ro, self._undo_available(ro))
            )

        return await self._once(
            request.request_id, "CancelRollout", fleet_pb2.CancelRolloutResponse, make
        )

    @refusals_as_status
    async def UndoRollout(
        self, request: fleet_pb2.UndoRolloutRequest, context: Context
    ) -> fleet_pb2.UndoRolloutResponse:
        """Roll back to the revision before a rollout, as a new rollout."""

        async def make() -> fleet_pb2.UndoRolloutResponse:
            ro, applied = self._changes.undo(
                request.id, by=caller_of(context), dry_run=request.dry_run
            )
            answer = fleet_pb2.UndoRolloutResponse(model=convert.catalog_model(applied.record))
            if ro is not None:
                answer.rollout.CopyFrom(convert.rollout(ro))
            return answer

        if request.dry_run:
            return await make()
        return await self._once(
            request.request_id, "UndoRollout", fleet_pb2.UndoRolloutResponse, make
        )
