"""The FleetService servicer: each RPC converts its request, calls the application layer
(fleet_svc.app) and converts the answer; refusals become statuses through one table, for the
streams as for the unary calls."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from fleet_svc.app import ChangeOptions, FleetApp
from fleet_svc.controller import Controller
from fleet_svc.rpc import convert
from fleet_svc.rpc.auth import current_caller
from fleet_svc.rpc.status import refusals_as_status, stream_refusals_as_status
from fleet_svc.store.base import Store
from fleet_svc.watch import SYNCED
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.limits import DEFAULT_LIMITS, Limits

log = structlog.get_logger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

M = TypeVar("M", bound=Message)


def caller_of(context: Context) -> str:
    """Who makes a call, for `by`, `updated_by` and `created_by`: the identity the fleet's
    auth interceptor verified (fleet_svc.rpc.auth), with the person a gateway acts for."""
    caller = current_caller()
    if caller is None:  # only a servicer driven without the fleet's server
        return f"anonymous@{context.peer()}"
    return caller.audit_name


def _change(report: object, restarted: int, kind: type[M]) -> M:
    """The planner's account of a change, with the replicas the fleet restarts for it."""
    assert isinstance(report, kind), f"the planner's report is a {type(report).__name__}"
    change = kind()
    change.CopyFrom(report)
    change.restarted = restarted  # type: ignore[attr-defined]
    return change


class FleetServicer(fleet_pb2_grpc.FleetServiceServicer):
    """Serves the fleet's whole API: the catalog, nodes and replicas, SetContext, SetGPUs and
    rollouts."""

    def __init__(
        self, app: FleetApp, store: Store, controller: Controller, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self._app = app
        self._store = store
        self._controller = controller
        self._limits = limits

    async def _once(
        self,
        request_id: str,
        method: str,
        response: type[M],
        make: Callable[[], Awaitable[M]],
    ) -> M:
        """`make`'s answer, or the first answer given to `request_id`."""

        async def encoded() -> bytes:
            return (await make()).SerializeToString()

        return response.FromString(await self._app.once(request_id, method, encoded))

    # -- the catalog -----------------------------------------------------------------------------

    @refusals_as_status
    async def CreateModel(
        self, request: fleet_pb2.CreateModelRequest, context: Context
    ) -> fleet_pb2.CreateModelResponse:
        """Add a model."""

        async def make() -> fleet_pb2.CreateModelResponse:
            entry = convert.accepted_entry(request.model, self._limits)
            rev = self._app.create_model(entry, caller_of(context))
            return fleet_pb2.CreateModelResponse(model=convert.catalog_model(rev))

        return await self._once(
            request.request_id, "CreateModel", fleet_pb2.CreateModelResponse, make
        )

    @refusals_as_status
    async def GetModel(
        self, request: fleet_pb2.GetModelRequest, context: Context
    ) -> fleet_pb2.GetModelResponse:
        """One model with its etag."""
        return fleet_pb2.GetModelResponse(
            model=convert.catalog_model(self._app.model(request.name))
        )

    @refusals_as_status
    async def ListModels(
        self, request: fleet_pb2.ListModelsRequest, context: Context
    ) -> fleet_pb2.ListModelsResponse:
        """The catalog."""
        return fleet_pb2.ListModelsResponse(
            models=[convert.catalog_model(r) for r in self._app.models()]
        )

    @refusals_as_status
    async def UpdateModel(
        self, request: fleet_pb2.UpdateModelRequest, context: Context
    ) -> fleet_pb2.UpdateModelResponse:
        """Replace a model, guarded by its etag."""

        async def make() -> fleet_pb2.UpdateModelResponse:
            entry = convert.accepted_entry(request.model, self._limits)
            rev = self._app.update_model(entry, request.etag, caller_of(context))
            return fleet_pb2.UpdateModelResponse(model=convert.catalog_model(rev))

        return await self._once(
            request.request_id, "UpdateModel", fleet_pb2.UpdateModelResponse, make
        )

    @refusals_as_status
    async def DeleteModel(
        self, request: fleet_pb2.DeleteModelRequest, context: Context
    ) -> fleet_pb2.DeleteModelResponse:
        """Remove a model; its replicas are drained and stopped."""

        async def make() -> fleet_pb2.DeleteModelResponse:
            rev = self._app.delete_model(request.name, request.etag, caller_of(context))
            return fleet_pb2.DeleteModelResponse(model=convert.catalog_model(rev))

        return await self._once(
            request.request_id, "DeleteModel", fleet_pb2.DeleteModelResponse, make
        )

    @refusals_as_status
    async def ListModelRevisions(
        self, request: fleet_pb2.ListModelRevisionsRequest, context: Context
    ) -> fleet_pb2.ListModelRevisionsResponse:
        """A model's history."""
        return fleet_pb2.ListModelRevisionsResponse(
            revisions=[convert.catalog_model(r) for r in self._app.history(request.name)]
        )

    # -- nodes and replicas ----------------------------------------------------------------------

    @refusals_as_status
    async def ListNodes(
        self, request: fleet_pb2.ListNodesRequest, context: Context
    ) -> fleet_pb2.ListNodesResponse:
        """The nodes and their phases."""
        state = self._controller.state
        replicas = list(state.replicas.values())
        return fleet_pb2.ListNodesResponse(
            nodes=[
                convert.node(v, replicas, self._controller.wall_of(v.last_heard_s))
                for v in sorted(state.nodes.values(), key=lambda v: v.name)
            ]
        )

    @refusals_as_status
    async def ListReplicas(
        self, request: fleet_pb2.ListReplicasRequest, context: Context
    ) -> fleet_pb2.ListReplicasResponse:
        """The replicas, their phases and why."""
        if request.model:
            self._app.model(request.model)
        replicas = sorted(
            (
                r
                for r in self._controller.state.replicas.values()
                if not request.model or r.model == request.model
            ),
            key=lambda r: (r.model, r.profile, r.id),
        )
        return fleet_pb2.ListReplicasResponse(replicas=[convert.replica(r) for r in replicas])

    @stream_refusals_as_status
    async def WatchReplicas(
        self, request: fleet_pb2.WatchReplicasRequest, context: Context
    ) -> AsyncIterator[fleet_pb2.WatchReplicasResponse]:
        """Ready endpoints: a snapshot, SYNCED, then additions and removals as they happen."""
        # A watcher cut off for falling behind (WatcherTooSlow) ends through the error table.
        async for event in self._controller.hub.watch(request.model):
            yield convert.endpoint_event(event, event is SYNCED)

    # -- planned changes and rollouts ------------------------------------------------------------

    @refusals_as_status
    async def SetContext(
        self, request: fleet_pb2.SetContextRequest, context: Context
    ) -> fleet_pb2.SetContextResponse:
        """A new context: planner, catalog, rollout."""

        async def make() -> fleet_pb2.SetContextResponse:
            planned, applied = await self._app.set_context(
                request.name,
                tokens=request.tokens,
                slots=request.slots,
                etag=request.etag,
                options=ChangeOptions(
                    by=caller_of(context),
                    dry_run=request.dry_run,
                    strategy=convert.strategy_of(request.strategy),
                    supersede=request.supersede,
                    surge=request.surge,
                ),
            )
            return fleet_pb2.SetContextResponse(
                change=_change(planned.report, applied.restarted, common_pb2.ContextChange),
                rollout_id=applied.rollout_id,
                model=convert.catalog_model(applied.revision),
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
            planned, applied = await self._app.set_gpus(
                request.name,
                gpus=request.gpus,
                profile=request.profile,
                etag=request.etag,
                options=ChangeOptions(
                    by=caller_of(context),
                    dry_run=request.dry_run,
                    strategy=convert.strategy_of(request.strategy, request.in_place),
                    supersede=request.supersede,
                    surge=request.surge,
                ),
            )
            return fleet_pb2.SetGPUsResponse(
                change=_change(planned.report, applied.restarted, common_pb2.GPUsChange),
                rollout_id=applied.rollout_id,
                model=convert.catalog_model(applied.revision),
            )

        if request.dry_run:
            return await make()
        return await self._once(request.request_id, "SetGPUs", fleet_pb2.SetGPUsResponse, make)

    @refusals_as_status
    async def GetRollout(
        self, request: fleet_pb2.GetRolloutRequest, context: Context
    ) -> fleet_pb2.GetRolloutResponse:
        """One rollout."""
        ro = self._app.rollout(request.id)
        return fleet_pb2.GetRolloutResponse(
            rollout=convert.rollout(ro, self._app.undo_available(ro))
        )

    @refusals_as_status
    async def ListRollouts(
        self, request: fleet_pb2.ListRolloutsRequest, context: Context
    ) -> fleet_pb2.ListRolloutsResponse:
        """Rollouts, newest first."""
        return fleet_pb2.ListRolloutsResponse(
            rollouts=[
                convert.rollout(ro, self._app.undo_available(ro))
                for ro in self._app.rollouts(request.model)
            ]
        )

    @stream_refusals_as_status
    async def WatchRollout(
        self, request: fleet_pb2.WatchRolloutRequest, context: Context
    ) -> AsyncIterator[fleet_pb2.WatchRolloutResponse]:
        """A rollout's events after `after_seq`, then live ones until it ends."""
        self._app.rollout(request.id)
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
            ro = self._app.cancel_rollout(request.id, caller_of(context))
            return fleet_pb2.CancelRolloutResponse(
                rollout=convert.rollout(ro, self._app.undo_available(ro))
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
            ro, applied = self._app.undo(request.id, by=caller_of(context), dry_run=request.dry_run)
            answer = fleet_pb2.UndoRolloutResponse(model=convert.catalog_model(applied.revision))
            if ro is not None:
                answer.rollout.CopyFrom(convert.rollout(ro))
            return answer

        if request.dry_run:
            return await make()
        return await self._once(
            request.request_id, "UndoRollout", fleet_pb2.UndoRolloutResponse, make
        )


SERVICE_NAME = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name
"""The fleet API's full service name, for health and reflection."""


def add_fleet_service(
    server: grpc.aio.Server,
    app: FleetApp,
    store: Store,
    controller: Controller,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    """Serve the fleet API on `server`, holding models to `limits`."""
    fleet_pb2_grpc.add_FleetServiceServicer_to_server(
        FleetServicer(app, store, controller, limits), server
    )
