"""The FleetService servicer: each RPC converts its request, calls the application layer
(fleet_svc.app) and converts the answer; refusals become statuses through one table, for the
streams as for the unary calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from fleet_svc.app import ChangeOptions, FleetApp
from fleet_svc.controller import Controller
from fleet_svc.domain.asked import ContextAsk, GPUsAsk
from fleet_svc.domain.rollout import RolloutState
from fleet_svc.rpc import canary_convert, convert
from fleet_svc.rpc.auth import current_caller
from fleet_svc.rpc.status import refusals_as_status, stream_refusals_as_status
from fleet_svc.store.base import Store
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.limits import DEFAULT_LIMITS, Limits

log = structlog.get_logger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

M = TypeVar("M", bound=Message)

WATCH_REREAD_S = 1.0
"""A rollout's watch reads its events again at least this often, woken or not."""
END_SETTLE_READS = 5
"""Reads of an ended rollout's events, WATCH_REREAD_S apart, before a watch ends without the
event that says how it ended."""


def caller_of(context: Context) -> str:
    """Who makes a call, for `by`, `updated_by` and `created_by`: the identity the fleet's
    auth interceptor verified (fleet_svc.rpc.auth), with the person a gateway acts for."""
    caller = current_caller()
    if caller is None:  # only a servicer driven without the fleet's server
        return f"anonymous@{context.peer()}"
    return caller.audit_name


def now(make: Callable[[], M]) -> Callable[[], Awaitable[Callable[[], M]]]:
    """A change with nothing to wait for before its commit (no planner): the commit is `make`."""

    async def prepare() -> Callable[[], M]:
        return make

    return prepare


def _change(report: bytes, restarted: int, kind: type[M]) -> M:
    """The planner's account of a change (as it sent it), with the replicas the fleet
    restarts for it."""
    change = kind.FromString(report)
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
        request: Message,
        method: str,
        response: type[M],
        prepare: Callable[[], Awaitable[Callable[[], M]]],
        *,
        dry_run: bool = False,
    ) -> M:
        """The answer `prepare`'s commit makes, or the first answer given to the request's id
        (FleetApp.once: the commit and the id's record in one transaction). A dry run is
        answered afresh and its id not recorded."""
        if dry_run:
            return await self._app.dry(prepare)

        async def encoded() -> Callable[[], bytes]:
            commit = await prepare()
            return lambda: commit().SerializeToString()

        def still_true(answer: bytes) -> bool:
            # An answer naming a model revision holds until the model is deleted after it.
            for field, value in response.FromString(answer).ListFields():
                if field.name == "model" and isinstance(value, fleet_pb2.CatalogModel):
                    return not self._app.deleted_since(value.model.name, value.revision)
            return True

        request_id = str(request.request_id)  # type: ignore[attr-defined]
        answer = await self._app.once(
            request_id, method, convert.fingerprint(request), encoded, still_true
        )
        return response.FromString(answer)

    # -- the catalog -----------------------------------------------------------------------------

    @refusals_as_status
    async def CreateModel(
        self, request: fleet_pb2.CreateModelRequest, context: Context
    ) -> fleet_pb2.CreateModelResponse:
        """Add a model."""

        def make() -> fleet_pb2.CreateModelResponse:
            rev = self._app.create_model(
                convert.accepted_entry(request.model, self._limits), caller_of(context)
            )
            return fleet_pb2.CreateModelResponse(model=convert.catalog_model(rev))

        return await self._once(request, "CreateModel", fleet_pb2.CreateModelResponse, now(make))

    @refusals_as_status
    async def GetModel(
        self, request: fleet_pb2.GetModelRequest, context: Context
    ) -> fleet_pb2.GetModelResponse:
        """One model with its etag."""
        rev = await self._app.calls.run(self._app.model, request.name)
        return fleet_pb2.GetModelResponse(model=convert.catalog_model(rev))

    @refusals_as_status
    async def ListModels(
        self, request: fleet_pb2.ListModelsRequest, context: Context
    ) -> fleet_pb2.ListModelsResponse:
        """The catalog."""
        models = await self._app.calls.run(self._app.models)
        return fleet_pb2.ListModelsResponse(models=[convert.catalog_model(r) for r in models])

    @refusals_as_status
    async def UpdateModel(
        self, request: fleet_pb2.UpdateModelRequest, context: Context
    ) -> fleet_pb2.UpdateModelResponse:
        """Replace a model, guarded by its etag; what replicas run differently rolls out."""

        def make() -> fleet_pb2.UpdateModelResponse:
            applied = self._app.update_model(
                convert.accepted_entry(request.model, self._limits),
                request.etag,
                _options(request, caller_of(context)),
            )
            return fleet_pb2.UpdateModelResponse(
                model=convert.catalog_model(applied.revision),
                rollout_id=applied.rollout_id,
                restarted=applied.restarted,
                unchanged=applied.unchanged,
            )

        return await self._once(
            request,
            "UpdateModel",
            fleet_pb2.UpdateModelResponse,
            now(make),
            dry_run=request.dry_run,
        )

    @refusals_as_status
    async def DeleteModel(
        self, request: fleet_pb2.DeleteModelRequest, context: Context
    ) -> fleet_pb2.DeleteModelResponse:
        """Remove a model; its replicas are drained and stopped."""

        def make() -> fleet_pb2.DeleteModelResponse:
            rev = self._app.delete_model(request.name, request.etag, caller_of(context))
            return fleet_pb2.DeleteModelResponse(model=convert.catalog_model(rev))

        return await self._once(request, "DeleteModel", fleet_pb2.DeleteModelResponse, now(make))

    @refusals_as_status
    async def ListModelRevisions(
        self, request: fleet_pb2.ListModelRevisionsRequest, context: Context
    ) -> fleet_pb2.ListModelRevisionsResponse:
        """A model's history."""
        history = await self._app.calls.run(self._app.history, request.name)
        return fleet_pb2.ListModelRevisionsResponse(
            revisions=[convert.catalog_model(r) for r in history]
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
            await self._app.calls.run(self._app.model, request.model)
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
        """Routable endpoints: a snapshot (or the events missed since `after_seq`), SYNCED,
        then each change, and heartbeats while nothing changes."""
        if request.model:
            await self._app.calls.run(
                self._app.model, request.model
            )  # MODEL_NOT_FOUND through the table
        remaining = context.time_remaining()
        log.info(
            "watch_opened",
            model=request.model,
            after_seq=request.after_seq,
            deadline_s=None if remaining is None else round(remaining, 3),
        )
        events = self._controller.hub.watch(
            request.model, after_seq=max(request.after_seq, 0), epoch=request.epoch
        )
        # A watcher cut off for falling behind (WatcherTooSlow) ends through the error table.
        async for event in events:
            yield convert.endpoint_event(event)

    # -- planned changes and rollouts ------------------------------------------------------------

    @refusals_as_status
    async def SetContext(
        self, request: fleet_pb2.SetContextRequest, context: Context
    ) -> fleet_pb2.SetContextResponse:
        """A new context: planner, catalog, rollout."""

        async def prepare() -> Callable[[], fleet_pb2.SetContextResponse]:
            planned, commit = await self._app.prepare_context(
                request.name,
                ContextAsk(request.tokens, request.slots, request.sequences),
                etag=request.etag,
                options=_options(request, caller_of(context)),
            )

            def answer() -> fleet_pb2.SetContextResponse:
                applied = commit()
                return fleet_pb2.SetContextResponse(
                    change=_change(planned.report, applied.restarted, common_pb2.ContextChange),
                    rollout_id=applied.rollout_id,
                    model=convert.catalog_model(applied.revision),
                    unchanged=applied.unchanged,
                    batches=[convert.batch_to_proto(b) for b in planned.batches],
                )

            return answer

        return await self._once(
            request, "SetContext", fleet_pb2.SetContextResponse, prepare, dry_run=request.dry_run
        )

    @refusals_as_status
    async def SetGPUs(
        self, request: fleet_pb2.SetGPUsRequest, context: Context
    ) -> fleet_pb2.SetGPUsResponse:
        """N cards a replica: planner, catalog, rollout."""

        async def prepare() -> Callable[[], fleet_pb2.SetGPUsResponse]:
            planned, commit = await self._app.prepare_gpus(
                request.name,
                GPUsAsk(request.gpus, request.profile, request.sequences),
                etag=request.etag,
                options=_options(request, caller_of(context), in_place=request.in_place),
            )

            def answer() -> fleet_pb2.SetGPUsResponse:
                applied = commit()
                return fleet_pb2.SetGPUsResponse(
                    change=_change(planned.report, applied.restarted, common_pb2.GPUsChange),
                    rollout_id=applied.rollout_id,
                    model=convert.catalog_model(applied.revision),
                    unchanged=applied.unchanged,
                    batches=[convert.batch_to_proto(b) for b in planned.batches],
                )

            return answer

        return await self._once(
            request, "SetGPUs", fleet_pb2.SetGPUsResponse, prepare, dry_run=request.dry_run
        )

    def _rollout_now(self, rollout_id: str) -> fleet_pb2.Rollout:
        """A rollout as the store holds it now, with whether it can be undone."""
        ro = self._app.rollout(rollout_id)
        return convert.rollout(ro, self._app.undo_available(ro))

    def _rollouts_now(self, model: str) -> list[fleet_pb2.Rollout]:
        return [
            convert.rollout(ro, self._app.undo_available(ro)) for ro in self._app.rollouts(model)
        ]

    @refusals_as_status
    async def GetRollout(
        self, request: fleet_pb2.GetRolloutRequest, context: Context
    ) -> fleet_pb2.GetRolloutResponse:
        """One rollout."""
        rollout = await self._app.calls.run(self._rollout_now, request.id)
        return fleet_pb2.GetRolloutResponse(rollout=rollout)

    @refusals_as_status
    async def ListRollouts(
        self, request: fleet_pb2.ListRolloutsRequest, context: Context
    ) -> fleet_pb2.ListRolloutsResponse:
        """Rollouts, newest first."""
        rollouts = await self._app.calls.run(self._rollouts_now, request.model)
        return fleet_pb2.ListRolloutsResponse(rollouts=rollouts)

    @stream_refusals_as_status
    async def WatchRollout(
        self, request: fleet_pb2.WatchRolloutRequest, context: Context
    ) -> AsyncIterator[fleet_pb2.WatchRolloutResponse]:
        """A rollout's events after `after_seq`, then live ones until it ends."""
        calls = self._app.calls
        watched = await calls.run(self._app.rollout, request.id)
        seq = max(request.after_seq, 0)
        last_state = RolloutState.RUNNING
        settle = END_SETTLE_READS
        while True:
            signal = self._controller.rollout_signal
            for event in await calls.run(self._app.rollout_events, request.id, seq):
                seq, last_state = event.seq, event.state
                yield convert.rollout_event(event, watched)
            if (await calls.run(self._app.rollout, request.id)).done:
                # Ended. Its events are stored with (or before) the state that ends it, but a
                # read may fall between the two writes, so it reads again until an event says
                # how it ended.
                for event in await calls.run(self._app.rollout_events, request.id, seq):
                    seq, last_state = event.seq, event.state
                    yield convert.rollout_event(event, watched)
                settle -= 1
                if last_state is not RolloutState.RUNNING or settle <= 0:
                    return
            with contextlib.suppress(TimeoutError):
                # Woken by the rollout's events, or read again after a while: on a fleet that
                # follows, the signal comes from polling the store (Controller.follow).
                await asyncio.wait_for(signal.wait(), WATCH_REREAD_S)

    @refusals_as_status
    async def CancelRollout(
        self, request: fleet_pb2.CancelRolloutRequest, context: Context
    ) -> fleet_pb2.CancelRolloutResponse:
        """Stop a running rollout; old replicas keep serving."""

        def make() -> fleet_pb2.CancelRolloutResponse:
            ro = self._app.cancel_rollout(request.id, caller_of(context))
            return fleet_pb2.CancelRolloutResponse(rollout=convert.rollout(ro))

        await self._once(request, "CancelRollout", fleet_pb2.CancelRolloutResponse, now(make))
        # The rollout as it is once the controller took the request up (a retry too).
        rollout = await self._app.calls.run(self._rollout_now, request.id)
        return fleet_pb2.CancelRolloutResponse(rollout=rollout)

    @refusals_as_status
    async def UndoRollout(
        self, request: fleet_pb2.UndoRolloutRequest, context: Context
    ) -> fleet_pb2.UndoRolloutResponse:
        """Roll back to the revision before a rollout, as a new rollout."""

        def make() -> fleet_pb2.UndoRolloutResponse:
            policy = (
                canary_convert.policy_of_proto(request.canary)
                if request.HasField("canary")
                else None
            )
            ro, applied = self._app.undo(
                request.id, by=caller_of(context), dry_run=request.dry_run, canary=policy
            )
            answer = fleet_pb2.UndoRolloutResponse(model=convert.catalog_model(applied.revision))
            if ro is not None:
                answer.rollout.CopyFrom(convert.rollout(ro))
            return answer

        answer = await self._once(
            request,
            "UndoRollout",
            fleet_pb2.UndoRolloutResponse,
            now(make),
            dry_run=request.dry_run,
        )
        if answer.rollout.id and not request.dry_run:
            # The new rollout as it is once the controller took it up (a retry too).
            answer.rollout.CopyFrom(await self._app.calls.run(self._rollout_now, answer.rollout.id))
        return answer

    @refusals_as_status
    async def PromoteRollout(
        self, request: fleet_pb2.PromoteRolloutRequest, context: Context
    ) -> fleet_pb2.PromoteRolloutResponse:
        """Move a canary to its next step (or past every step) without its analysis."""

        def make() -> fleet_pb2.PromoteRolloutResponse:
            ro = self._app.promote_rollout(request.id, full=request.full, by=caller_of(context))
            return fleet_pb2.PromoteRolloutResponse(rollout=convert.rollout(ro))

        await self._once(request, "PromoteRollout", fleet_pb2.PromoteRolloutResponse, now(make))
        rollout = await self._app.calls.run(self._rollout_now, request.id)
        return fleet_pb2.PromoteRolloutResponse(rollout=rollout)

    @refusals_as_status
    async def ReportTraffic(
        self, request: fleet_pb2.ReportTrafficRequest, context: Context
    ) -> fleet_pb2.ReportTrafficResponse:
        """One gateway instance's traffic of one interval, kept once for canary analysis."""
        kept = await self._app.report_traffic(
            request.gateway,
            request.interval_start.ToNanoseconds() / 1e9,
            request.interval_s,
            canary_convert.endpoint_reports(request),
        )
        return fleet_pb2.ReportTrafficResponse(duplicate=not kept)


ChangeRequest = (
    fleet_pb2.SetContextRequest | fleet_pb2.SetGPUsRequest | fleet_pb2.UpdateModelRequest
)


def _options(request: ChangeRequest, by: str, *, in_place: bool = False) -> ChangeOptions:
    """How a change's request asks for it to be carried out (its strategy and canary)."""
    policy = request.canary if request.HasField("canary") else None
    strategy, canary = canary_convert.change_strategy(request.strategy, policy, in_place=in_place)
    return ChangeOptions(
        by=by,
        dry_run=request.dry_run,
        strategy=strategy,
        supersede=request.supersede,
        surge=request.surge,
        allow_unchecked=getattr(request, "allow_unchecked", False),
        canary=canary,
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
