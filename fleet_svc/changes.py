"""Applying plans: SetContext and SetGPUs ask the planner, commit the catalog and start a
rollout; UndoRollout rolls a model back to the revision before a rollout."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import grpc
import structlog
from grpc_status import rpc_status

from fleet_svc.catalog import Catalog, model_of
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.phases import HOLDS_CARDS
from fleet_svc.domain.placement import Want
from fleet_svc.domain.rollout import Rollout, Strategy, plan_steps, room_beside
from fleet_svc.rollouts import load_rollout
from fleet_svc.rpc.status import PlannerRefused
from fleet_svc.store.base import ModelRecord, Store
from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2

log = structlog.get_logger(__name__)

PLANNER_TIMEOUT_S = 60.0
"""How long the fleet waits for the planner (a cold Hugging Face fetch can be slow)."""


class Planner(Protocol):
    """What the fleet needs of the planner."""

    async def size_context(
        self, request: planner_pb2.SizeContextRequest
    ) -> planner_pb2.SizeContextResponse:
        """SizeContext."""

    async def plan_gpus(self, request: planner_pb2.PlanGPUsRequest) -> planner_pb2.PlanGPUsResponse:
        """PlanGPUs."""


class PlannerClient:
    """The planner over gRPC; its refusals are passed on unchanged."""

    def __init__(self, address: str) -> None:
        from llmgw.planner.v1 import planner_pb2_grpc

        self._channel = grpc.aio.insecure_channel(address)
        self._stub = planner_pb2_grpc.PlannerServiceStub(self._channel)
        self.address = address

    async def _call(self, method: str, request: object) -> object:
        try:
            return await getattr(self._stub, method)(request, timeout=PLANNER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise errors.PlannerUnavailable(
                    f"the planner at {self.address} did not answer ({err.code().name}); nothing "
                    "changed: try again"
                ) from err
            status = rpc_status.from_call(err)
            if status is None:
                from google.rpc import status_pb2

                status = status_pb2.Status(code=err.code().value[0], message=err.details() or "")
            raise PlannerRefused(status) from err

    async def size_context(
        self, request: planner_pb2.SizeContextRequest
    ) -> planner_pb2.SizeContextResponse:
        """SizeContext on the planner."""
        answer = await self._call("SizeContext", request)
        assert isinstance(answer, planner_pb2.SizeContextResponse)
        return answer

    async def plan_gpus(self, request: planner_pb2.PlanGPUsRequest) -> planner_pb2.PlanGPUsResponse:
        """PlanGPUs on the planner."""
        answer = await self._call("PlanGPUs", request)
        assert isinstance(answer, planner_pb2.PlanGPUsResponse)
        return answer

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()


@dataclass(frozen=True)
class Applied:
    """What a change did: the catalog record (as committed or as it would be) and the
    rollout carrying it out ("" for a dry run or when no replica needs replacing)."""

    record: ModelRecord
    rollout_id: str
    restarted: int


class Changes:
    """SetContext, SetGPUs and UndoRollout over the catalog, the planner and the controller."""

    def __init__(
        self,
        catalog: Catalog,
        controller: Controller,
        store: Store,
        planner: Planner,
        clock: Callable[[], float],
    ) -> None:
        self._catalog = catalog
        self._controller = controller
        self._store = store
        self.planner = planner
        self._clock = clock

    def inventory(self) -> common_pb2.Inventory:
        """The live inventory: every READY node's cards, as its agent reports them."""
        state = self._controller.state
        nodes = []
        for view in sorted(state.nodes.values(), key=lambda v: v.name):
            if view.phase.value != "READY":
                continue
            used = {
                g
                for r in state.replicas.values()
                if r.node == view.name and r.phase in HOLDS_CARDS
                for g in r.gpus
            }
            memory = [c.memory_total_bytes for c in view.cards if c.memory_total_bytes > 0]
            nodes.append(
                common_pb2.InventoryNode(
                    name=view.name,
                    gpu_class=view.gpu_class,
                    gpus=len(view.cards),
                    free_gpus=sum(1 for c in view.cards if c.index not in used),
                    gpu_memory_bytes=min(memory) if memory else 0,
                    memory_bytes=view.memory_bytes,
                )
            )
        return common_pb2.Inventory(nodes=nodes)

    def _read(self, name: str, etag: str, supersede: bool) -> ModelRecord:
        """The model to change, refused when declared, stale or already rolling out."""
        record = self._catalog.get(name)
        self._catalog.check_writable(name)
        if etag and etag != str(record.revision):
            raise errors.StaleRevision(
                f"model {name!r} is at revision {record.revision}, not {etag}: read it again",
                name=name,
                expected=etag,
                current=record.revision,
            )
        running = self._controller.running_rollout(name)
        if running is not None and not supersede:
            raise errors.RolloutInProgress(
                f"model {name!r} is rolling out {running.id}: wait for it, cancel it, or "
                "supersede it",
                name=name,
                rollout_id=running.id,
            )
        return record

    def _ask_for(
        self,
        request: planner_pb2.SizeContextRequest | planner_pb2.PlanGPUsRequest,
        etag: str,
        supersede: bool,
    ) -> tuple[ModelRecord, common_pb2.Model]:
        """Read the model to change and fill the planner's request with it and the live
        inventory."""
        record = self._read(request.model.name, etag, supersede)
        model = model_of(record)
        request.model.CopyFrom(model)
        request.inventory.CopyFrom(self.inventory())
        return record, model

    async def set_context(
        self,
        request: planner_pb2.SizeContextRequest,
        *,
        etag: str,
        by: str,
        dry_run: bool,
        strategy: Strategy,
        supersede: bool,
        surge: int,
    ) -> tuple[planner_pb2.SizeContextResponse, Applied]:
        """Size a new context with the planner and roll it out.

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress, NoRoomBeside,
            PlannerRefused, PlannerUnavailable.
        """
        record, model = self._ask_for(request, etag, supersede)
        answer = await self.planner.size_context(request)
        # The planner took time: the model may have changed meanwhile.
        record = self._read(model.name, str(record.revision), supersede)
        new = _with_profiles(model, answer.profiles)
        new.context_length = answer.change.after
        new.max_output = answer.change.max_output
        applied = self._apply(
            record,
            new,
            kind="context",
            by=by,
            dry_run=dry_run,
            strategy=strategy,
            supersede=supersede,
            surge=surge,
        )
        answer.change.restarted = applied.restarted
        return answer, applied

    async def set_gpus(
        self,
        request: planner_pb2.PlanGPUsRequest,
        *,
        etag: str,
        by: str,
        dry_run: bool,
        strategy: Strategy,
        supersede: bool,
        surge: int,
    ) -> tuple[planner_pb2.PlanGPUsResponse, Applied]:
        """Plan N cards a replica with the planner and roll it out.

        Raises:
            as set_context.
        """
        record, model = self._ask_for(request, etag, supersede)
        answer = await self.planner.plan_gpus(request)
        record = self._read(model.name, str(record.revision), supersede)
        new = _with_profiles(model, answer.profiles)
        applied = self._apply(
            record,
            new,
            kind="gpus",
            by=by,
            dry_run=dry_run,
            strategy=strategy,
            supersede=supersede,
            surge=surge,
        )
        answer.change.restarted = applied.restarted
        return answer, applied

    def undo(self, rollout_id: str, *, by: str, dry_run: bool) -> tuple[Rollout | None, Applied]:
        """Roll a model back to the revision before `rollout_id`, as a new rollout.

        Raises:
            RolloutNotFound, CannotUndo, ModelDeclared, NoRoomBeside.
        """
        rec = self._store.get_rollout(rollout_id)
        if rec is None:
            raise errors.RolloutNotFound(f"no rollout {rollout_id!r}", rollout_id=rollout_id)
        ro = load_rollout(rec)
        if not ro.done:
            raise errors.CannotUndo(
                f"rollout {rollout_id} is still running: cancel it first", rollout_id=rollout_id
            )
        current = self._catalog.get(ro.model)
        if current.revision != ro.to_revision:
            raise errors.CannotUndo(
                f"{ro.model} changed after rollout {rollout_id} (now revision {current.revision}):"
                " undo the later change first",
                rollout_id=rollout_id,
            )
        previous = next(
            (r for r in self._catalog.history(ro.model) if r.revision == ro.from_revision), None
        )
        if previous is None or previous.deleted:
            raise errors.CannotUndo(
                f"revision {ro.from_revision} of {ro.model} is not there to go back to",
                rollout_id=rollout_id,
            )
        record = self._read(ro.model, "", supersede=False)
        applied = self._apply(
            record,
            model_of(previous),
            kind="undo",
            by=by,
            dry_run=dry_run,
            strategy=ro.strategy,
            supersede=False,
            surge=ro.surge,
            undo_of=rollout_id,
        )
        if not applied.rollout_id:
            return None, applied
        return self._controller.rollouts.get(applied.rollout_id), applied

    def _apply(
        self,
        record: ModelRecord,
        new: common_pb2.Model,
        *,
        kind: str,
        by: str,
        dry_run: bool,
        strategy: Strategy,
        supersede: bool,
        surge: int,
        undo_of: str = "",
    ) -> Applied:
        """Check room, commit the new revision and start the rollout (or, dry, only check)."""
        old = model_of(record)
        old_profiles = {p.name: p for p in old.profiles}
        changed = {
            p.name
            for p in new.profiles
            if p.name not in old_profiles or old_profiles[p.name] != p or old.source != new.source
        }
        state = self._controller.state
        if strategy is Strategy.BESIDE:
            for p in new.profiles:
                if p.name not in changed or p.cpu_only or not p.gpu_class:
                    continue
                serving = [
                    r
                    for r in state.replicas.values()
                    if r.model == old.name and r.profile == p.name and not r.retire
                ]
                if not serving:
                    continue
                want = Want(gpu_class=p.gpu_class, gpus=max(p.gpus_per_node, p.tp, 1))
                room, most = room_beside(want, state.nodes, state.replicas)
                if not room:
                    raise errors.NoRoomBeside(
                        f"no node has {want.gpus} free {p.gpu_class} card"
                        f"{'s' if want.gpus != 1 else ''} to start a new {p.name} replica beside "
                        f"an old one (the most free on a node is {most}): --in-place stops each "
                        "replica first",
                        name=old.name,
                        profile=p.name,
                        gpu_class=p.gpu_class,
                        need_gpus=want.gpus,
                        most_free=most,
                    )
        wanted_old = {w.profile: w for w in self._catalog.wants() if w.model == old.name}
        restarted = sum(
            1
            for r in state.replicas.values()
            if r.model == old.name and r.profile in changed and not r.retire
        )
        if dry_run:
            preview = ModelRecord(
                name=record.name,
                revision=record.revision + 1,
                spec=self._catalog.spec(new),
                updated_by=by,
                updated_at=self._clock(),
            )
            return Applied(preview, "", restarted)
        running = self._controller.running_rollout(old.name)
        if running is not None and supersede:
            self._controller.cancel(running.id, "superseded by a newer change of the model")
        committed = self._catalog.update(new, str(record.revision), by)
        wants = [w for w in self._catalog.wants() if w.model == old.name]
        steps = plan_steps(old.name, changed, state.replicas, wants)
        if not steps:
            return Applied(committed, "", 0)
        ro = Rollout(
            id="ro-" + uuid.uuid4().hex[:10],
            model=old.name,
            kind=kind,
            strategy=strategy,
            from_revision=record.revision,
            to_revision=committed.revision,
            steps=steps,
            surge=max(surge, 1),
            created_s=self._clock(),
            by=by,
            undo_of=undo_of,
            start_timeout_s=self._controller.start_timeout_s,
            old_specs={name: dict(w.spec) for name, w in wanted_old.items()},
        )
        self._controller.start_rollout(ro)
        log.info("change_applied", model=old.name, kind=kind, rollout_id=ro.id, steps=len(steps))
        return Applied(committed, ro.id, restarted)


def _with_profiles(
    model: common_pb2.Model, profiles: Iterable[common_pb2.Profile]
) -> common_pb2.Model:
    """A copy of `model` whose profiles are the planner's."""
    new = common_pb2.Model()
    new.CopyFrom(model)
    del new.profiles[:]
    new.profiles.extend(profiles)
    return new
