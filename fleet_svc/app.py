"""The fleet's application layer: every change of the catalog and of what runs, each guarded
in one place (the model is there, not declared, at the caller's etag and not rolling out;
a request id is answered once). Servicers convert messages and call it; it sees no protos.

It hands over to the controller through the store only: a change commits its revision, its
rollout (PENDING) or its request to cancel one, and the request id's answer in one
transaction, then wakes the controller, which takes them up from the store on its tick. No
controller memory is written here, so a change whose commit fails can never run."""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import structlog

from fleet_svc.answers import REQUEST_ID_WINDOW_S, Answers
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.asked import context_asked, gpus_asked
from fleet_svc.domain.canary import CanaryRun, Policy
from fleet_svc.domain.catalog import (
    Entry,
    Revision,
    changed_profiles,
    check_profiles,
    wants_of,
)
from fleet_svc.domain.control import cards_in_use
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import (
    Rollout,
    RolloutState,
    Strategy,
    mark_canaries,
    plan_steps,
)
from fleet_svc.domain.room import check_room
from fleet_svc.domain.traffic import EndpointReport, check_report
from fleet_svc.planner import Planned, Planner
from fleet_svc.store.base import RolloutRequest, Store, TrafficRecord
from fleet_svc.store.canary_rows import histogram_doc
from fleet_svc.store.catalog_rows import etag_of
from fleet_svc.store.rows import load_rollout, rollout_record
from fleet_svc.store_calls import StoreCalls
from llmgw.model import Inventory, Model, Node

log = structlog.get_logger(__name__)

ADOPT_WAIT_S = 5.0
"""How long a change's answer waits for the controller to take the change up, so the caller
reads its rollout started (or cancelled); past it (a store failing for the controller) the
answer goes out and the next tick takes the change up."""
TRAFFIC_KEPT_S = 86400.0
"""How long the gateways' traffic reports are kept (a canary's step windows lie within)."""
ACTIVE = (RolloutState.PENDING.value, RolloutState.RUNNING.value)
"""The stored states of a rollout that has not ended."""


@dataclass(frozen=True)
class View:
    """The controller's replicas and nodes as a change reads them (never writes them): the
    room it checks and the steps it plans. Taken on the event loop, where the controller
    changes them, before the change's transaction runs on a store thread."""

    replicas: Mapping[str, ReplicaState]
    nodes: Mapping[str, NodeView]
    handed: list[str] = field(default_factory=list)
    """Filled by the change: the rollouts and requests it wrote for the controller."""


_VIEW: contextvars.ContextVar[View] = contextvars.ContextVar("fleet_view")
"""The view the change being committed reads (FleetApp.once sets it for its transaction)."""

T = TypeVar("T")


def _in_view(commit: Callable[[], T], view: View) -> T:
    _VIEW.set(view)
    return commit()


@dataclass(frozen=True)
class ChangeOptions:
    """How a change is carried out: who asks, whether only to check, and how to roll it out."""

    by: str
    dry_run: bool = False
    strategy: Strategy = Strategy.BESIDE
    supersede: bool = False
    """Cancel a rollout of the model in progress instead of being refused by it."""
    surge: int = 0
    allow_unchecked: bool = False
    """Apply a plan the planner could not check (the model's shape unread)."""
    canary: Policy | None = None
    """The canary's policy (strategy CANARY; None for the others)."""


@dataclass(frozen=True)
class Applied:
    """What a change did: the revision (as committed; for a dry run as it would be, unwritten:
    revision 0, no etag) and the rollout carrying it out ("" for a dry run or when no replica
    needs replacing). `unchanged`: the model already was as asked, so nothing was written and
    `revision` is the current one."""

    revision: Revision
    rollout_id: str
    restarted: int
    unchanged: bool = False


class FleetApp:
    """The catalog's changes, SetContext, SetGPUs and the rollouts' controls."""

    def __init__(
        self,
        catalog: Catalog,
        controller: Controller,
        store: Store,
        planner: Planner,
        clock: Callable[[], float],
        *,
        request_id_window_s: float = REQUEST_ID_WINDOW_S,
        trace_context: Callable[[], str] = lambda: "",
    ) -> None:
        self._catalog = catalog
        self._controller = controller
        self._store = store
        self.planner = planner
        self._clock = clock
        self._answers = Answers(store, clock, request_id_window_s)
        self._trace_context = trace_context
        """The trace context of the request running now ("" when untraced): llmgw.tracing's
        current_traceparent where the fleet traces; a rollout keeps it for its replicas."""
        self.calls = StoreCalls(store)
        """Where the store calls made for a request run (off the loop for PostgreSQL)."""

    @property
    def request_id_window_s(self) -> float:
        """How long a request id's first answer is kept (a retry within it is answered so)."""
        return self._answers.window_s

    @request_id_window_s.setter
    def request_id_window_s(self, seconds: float) -> None:
        self._answers.window_s = seconds

    # -- the guards --------------------------------------------------------------------------

    async def once(
        self,
        request_id: str,
        method: str,
        fingerprint: str,
        prepare: Callable[[], Awaitable[Callable[[], bytes]]],
        still_true: Callable[[bytes], bool] = lambda _answer: True,
    ) -> bytes:
        """The answer to a mutation, made once per request id (fleet_svc.answers: `replay`, then
        `commit` on the store's threads); a change it hands the controller is waited for.

        Raises:
            RequestIdReused: the id was used for another method or another request.
        """
        if request_id:
            stored = await self.calls.run(
                self._answers.replay, request_id, method, fingerprint, still_true
            )
            if stored is not None:
                return stored
        commit = await prepare()
        view = self._view()
        try:
            answer = await self.calls.run(
                self._commit, request_id, method, fingerprint, commit, view, still_true
            )
        finally:
            # Wants the controller read while the transaction ran are read again.
            self._catalog.forget_wants()
        if view.handed:
            await self._controller.adopted(self._controller.changed(), ADOPT_WAIT_S)
        else:
            self._controller.wake()  # the wants changed: replicas to add or remove
        return answer

    async def dry(self, prepare: Callable[[], Awaitable[Callable[[], T]]]) -> T:
        """The answer to a dry run: `prepare`'s commit, run outside any transaction (it writes
        nothing) on the store's threads like a change."""
        commit = await prepare()
        return await self.calls.run(_in_view, commit, self._view())

    def _commit(
        self,
        request_id: str,
        method: str,
        fingerprint: str,
        commit: Callable[[], bytes],
        view: View,
        still_true: Callable[[bytes], bool],
    ) -> bytes:
        """Run `commit` and keep the request id's answer, in one transaction, reading `view`."""
        _VIEW.set(view)
        return self._answers.commit(request_id, method, fingerprint, commit, still_true)

    def _view(self) -> View:
        """What a change reads of the controller: inside FleetApp.once the view it took on
        the loop, else (a call on the loop) the controller's own maps."""
        view = _VIEW.get(None)
        if view is not None:
            return view
        state = self._controller.state
        return View(replicas=dict(state.replicas), nodes=dict(state.nodes))

    def _active(self, name: str) -> Rollout | None:
        """The model's rollout not ended yet (pending or running), as the store holds it."""
        found = self._store.list_rollouts(name, states=ACTIVE)
        return load_rollout(found[0]) if found else None

    def deleted_since(self, name: str, revision: int) -> bool:
        """Whether model `name` was deleted by a revision after `revision` (so an answer given
        at `revision` no longer says what is there)."""
        if not name or revision <= 0:
            return False
        try:
            history = self._catalog.history(name)
        except errors.ModelNotFound:
            return False
        return any(r.deleted and r.revision > revision for r in history)

    def _changeable(self, name: str, etag: str, *, supersede: bool | None = None) -> Revision:
        """The model about to change, refused when absent, declared, changed since the caller
        read it (a non-empty `etag`), or rolling out (unless `supersede`; None: the change
        cannot supersede a rollout).

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress.
        """
        rev = self._catalog.get(name)
        self._not_declared(name)
        if etag and etag != rev.etag:
            raise errors.StaleRevision(
                f"model {name!r} changed since etag {etag} was read (now revision "
                f"{rev.revision}, etag {rev.etag}): read it again and retry",
                name=name,
                expected=etag,
                current=rev.etag,
            )
        running = self._active(name)
        if running is not None and not supersede:
            how = (
                "wait for it or cancel it first"
                if supersede is None
                else ("wait for it, cancel it, or supersede it")
            )
            raise errors.RolloutInProgress(
                f"model {name!r} is rolling out {running.id}: {how}",
                name=name,
                rollout_id=running.id,
            )
        return rev

    def _not_declared(self, name: str) -> None:
        """Refuse a change of a model the settings file declares.

        Raises:
            ModelDeclared.
        """
        path = self._catalog.declared.get(name)
        if path is not None:
            raise errors.ModelDeclared(
                f"model {name!r} is declared in the cluster settings ({path}): change it there",
                name=name,
                path=path,
            )

    # -- reads ---------------------------------------------------------------------------------

    def model(self, name: str) -> Revision:
        """A model's latest revision.

        Raises:
            ModelNotFound.
        """
        return self._catalog.get(name)

    def models(self) -> list[Revision]:
        """Every current model."""
        return self._catalog.all()

    def history(self, name: str) -> list[Revision]:
        """Every revision of a model.

        Raises:
            ModelNotFound.
        """
        return self._catalog.history(name)

    def rollout(self, rollout_id: str) -> Rollout:
        """A rollout, running or ended.

        Raises:
            RolloutNotFound.
        """
        rec = self._store.get_rollout(rollout_id)
        if rec is None:
            raise errors.RolloutNotFound(f"no rollout {rollout_id!r}", rollout_id=rollout_id)
        return load_rollout(rec)

    def rollouts(self, model: str = "") -> list[Rollout]:
        """Rollouts of a model (every model when ""), newest first."""
        return [load_rollout(rec) for rec in self._store.list_rollouts(model)]

    def undo_available(self, ro: Rollout) -> bool:
        """Whether UndoRollout would take the model back before `ro` now."""
        if not ro.done or (ro.state is RolloutState.SUCCEEDED and ro.kind == "undo"):
            return False
        found = self._catalog.find(ro.model)
        return found is not None and found.revision == ro.to_revision

    def inventory(self) -> Inventory:
        """The live inventory: every READY node's cards, as its agent reports them."""
        state = self._controller.state
        nodes = []
        # Every member of a gang holds cards on its own node.
        held, _ram = cards_in_use(state.replicas)
        for view in sorted(state.nodes.values(), key=lambda v: v.name):
            if view.phase.value != "READY":
                continue
            used = held.get(view.name, set())
            memory = [c.memory_total_bytes for c in view.cards if c.memory_total_bytes > 0]
            cuda = [c.cuda_memory_total_bytes for c in view.cards if c.cuda_memory_total_bytes > 0]
            nodes.append(
                Node(
                    name=view.name,
                    gpu_class=view.gpu_class,
                    gpus=len(view.cards),
                    free_gpus=sum(1 for c in view.cards if c.index not in used),
                    gpu_memory_bytes=min(memory) if memory else 0,
                    memory_bytes=view.memory_bytes,
                    # Every card's CUDA total or none: one card unread leaves CUDA's unknown.
                    gpu_cuda_memory_bytes=min(cuda) if len(cuda) == len(view.cards) else 0,
                    engine_versions=tuple(sorted(view.engine_versions.items())),
                )
            )
        return Inventory(nodes=tuple(nodes))

    # -- catalog changes -------------------------------------------------------------------------

    def create_model(self, entry: Entry, by: str) -> Revision:
        """Add a model (checked at the API's edge).

        Raises:
            ModelDeclared, ModelExists.
        """
        self._not_declared(entry.name)
        if self._catalog.find(entry.name) is not None:
            raise errors.ModelExists(
                f"model {entry.name!r} is in the catalog already: update it instead",
                name=entry.name,
            )
        return self._catalog.write(entry, by, self._catalog.last_revision(entry.name))

    def update_model(self, entry: Entry, etag: str, options: ChangeOptions) -> Applied:
        """Replace a model, guarded by its etag (empty: unguarded), and roll out what its
        replicas run differently (source, engine, args, cards) as SetContext does; a change of
        replica counts alone is scaled by the controller, the other replicas left running.

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress, NoRoomBeside,
            NoRoomInPlace, InvalidModel.
        """
        check_profiles(entry.model)
        current = self._changeable(entry.name, etag, supersede=options.supersede)
        return self._apply(current, entry, "update", options)

    def delete_model(self, name: str, etag: str, by: str) -> Revision:
        """Remove a model (its replicas are drained and stopped).

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress.
        """
        current = self._changeable(name, etag)
        return self._catalog.write(current.entry, by, current.revision, deleted=True)

    # -- planned changes -------------------------------------------------------------------------

    async def prepare_context(
        self, name: str, *, tokens: int, slots: int, etag: str, options: ChangeOptions
    ) -> tuple[Planned, Callable[[], Applied]]:
        """Size a new context with the planner; the commit rolls it out (checked again).

        Returns:
            The planner's answer, and the commit (FleetApp.once runs it in one transaction).

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress, NoRoomBeside,
            NoRoomInPlace,
            PlannerUnavailable, and the planner's refusals.
        """
        rev = await self.calls.run(self._changeable, name, etag, supersede=options.supersede)
        planned = await self.planner.size_context(
            rev.entry, self.inventory(), tokens=tokens, slots=slots
        )
        # A no-op by what was asked: the planner's filled-in values are not written then.
        new = rev.model
        if context_asked(rev.model, tokens=tokens, slots=slots):
            self._checked(rev.name, planned, options)
            new = replace(
                rev.model,
                profiles=planned.profiles,
                context_length=planned.context_length,
                # An unset max_output stays unset (its default follows the context); one the
                # caller set follows the planner's rule.
                max_output=planned.max_output if rev.model.max_output else 0,
            )
        return planned, lambda: self._after_planning(rev, new, "context", options)

    async def prepare_gpus(
        self, name: str, *, gpus: int, profile: str, etag: str, options: ChangeOptions
    ) -> tuple[Planned, Callable[[], Applied]]:
        """Plan `gpus` cards a replica with the planner; the commit rolls it out (as
        prepare_context).

        Raises:
            as prepare_context.
        """
        rev = await self.calls.run(self._changeable, name, etag, supersede=options.supersede)
        planned = await self.planner.plan_gpus(
            rev.entry, self.inventory(), gpus=gpus, profile=profile
        )
        asked = gpus_asked(rev.model, gpus=gpus, profile=profile)
        if asked:
            self._checked(rev.name, planned, options)
        new = replace(rev.model, profiles=planned.profiles) if asked else rev.model
        return planned, lambda: self._after_planning(rev, new, "gpus", options)

    @staticmethod
    def _checked(name: str, planned: Planned, options: ChangeOptions) -> None:
        """Refuse to apply a plan the planner could not check, unless the caller asked for it
        (a dry run only answers, so it is let through: its change says NOT_CHECKED).

        Raises:
            PlanNotChecked.
        """
        if planned.unchecked and not options.allow_unchecked and not options.dry_run:
            raise errors.PlanNotChecked(
                f"the plan for {name!r} is not checked ({planned.unchecked}): make the model's "
                "source readable by the planner, or ask for it anyway (allow_unchecked, "
                "--allow-unchecked)",
                name=name,
                why=planned.unchecked,
            )

    def _after_planning(
        self, read: Revision, new: Model, kind: str, options: ChangeOptions
    ) -> Applied:
        """Apply a planned model, unless the model changed while the planner was asked.

        Raises:
            InvalidModel: the planner's profiles are not ones the fleet can run.
        """
        check_profiles(new)
        rev = self._changeable(read.name, read.etag, supersede=options.supersede)
        return self._apply(rev, rev.entry.with_model(new), kind, options)

    def undo(
        self, rollout_id: str, *, by: str, dry_run: bool, canary: Policy | None = None
    ) -> tuple[Rollout | None, Applied]:
        """Roll a model back to the revision before `rollout_id`, as a new rollout.

        Raises:
            RolloutNotFound, CannotUndo, ModelDeclared, RolloutInProgress, NoRoomBeside.
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
        rev = self._changeable(ro.model, "", supersede=False)
        # Undoing a canary goes back to a revision that served: beside, unless asked again.
        strategy: Strategy = Strategy.BESIDE if ro.strategy is Strategy.CANARY else ro.strategy
        if canary is not None:
            strategy = Strategy.CANARY
        options = ChangeOptions(
            by=by, dry_run=dry_run, strategy=strategy, surge=ro.surge, canary=canary
        )
        applied = self._apply(rev, previous.entry, "undo", options, undo_of=rollout_id)
        if not applied.rollout_id:
            return None, applied
        return self.rollout(applied.rollout_id), applied

    def cancel_rollout(self, rollout_id: str, by: str) -> Rollout:
        """Ask the controller to stop a rollout that has not ended (old replicas keep
        serving): a request it carries out on its next tick. The rollout as the store holds
        it now (ended already: nothing is asked).

        Raises:
            RolloutNotFound.
        """
        ro = self.rollout(rollout_id)
        if not ro.done:
            self._request_cancel(ro, f"cancelled by {by}", by)
        return ro

    def promote_rollout(self, rollout_id: str, *, full: bool, by: str) -> Rollout:
        """Ask the controller to move a canary on without its analysis: its next step, or
        (`full`) past every step. The rollout as the store holds it now.

        Raises:
            RolloutNotFound, NotCanary: the rollout is no canary being judged.
        """
        ro = self.rollout(rollout_id)
        if ro.canary is None or ro.done or ro.canary.promoted:
            why = (
                "is not a canary"
                if ro.canary is None
                else ("has ended" if ro.done else "is promoted already")
            )
            raise errors.NotCanary(
                f"rollout {rollout_id} {why}: only a running canary can be promoted",
                rollout_id=rollout_id,
            )
        kind = "promote_full" if full else "promote"
        self._request_cancel(ro, f"promoted by {by}", by, kind=kind)
        return ro

    async def report_traffic(
        self,
        gateway: str,
        interval_start_s: float,
        interval_s: int,
        endpoints: list[EndpointReport],
    ) -> bool:
        """Keep one gateway instance's traffic of one interval for canary analysis, once per
        (gateway, interval start); wake the controller to judge it.

        Returns:
            False when that (gateway, interval) was reported before (nothing counted again).

        Raises:
            InvalidRequest: the report cannot be counted (domain.traffic.check_report).
        """
        now = self._clock()
        check_report(gateway, interval_start_s, interval_s, endpoints, now)
        start_ms = round(interval_start_s * 1000)
        records = [
            TrafficRecord(
                gateway=gateway,
                interval_start_ms=start_ms,
                replica_id=e.replica_id,
                model=e.model,
                revision=e.revision,
                interval_s=interval_s,
                figures={
                    "requests": e.requests,
                    "errors_5xx": e.errors_5xx,
                    "timeouts": e.timeouts,
                    "context_refusals": e.context_refusals,
                    "ttft": histogram_doc(e.ttft),
                    "itl": histogram_doc(e.itl),
                },
                received_at=now,
            )
            for e in endpoints
        ]
        prune = round((now - TRAFFIC_KEPT_S) * 1000)
        kept = await self.calls.run(lambda: self._store.put_traffic(records, prune_before_ms=prune))
        if kept:
            self._controller.wake()
        return bool(kept)

    def _request_cancel(self, ro: Rollout, reason: str, by: str, kind: str = "cancel") -> None:
        self._view().handed.append(ro.id)
        self._store.put_rollout_request(
            RolloutRequest(
                id="rq-" + uuid.uuid4().hex[:10],
                rollout_id=ro.id,
                kind=kind,
                reason=reason,
                by=by,
                created_at=self._clock(),
            )
        )
        log.info("rollout_cancel_requested", rollout_id=ro.id, reason=reason)

    def _apply(
        self,
        rev: Revision,
        new: Entry,
        kind: str,
        options: ChangeOptions,
        *,
        undo_of: str = "",
    ) -> Applied:
        """Check room, write the new revision and its rollout, PENDING for the controller
        (or, dry, only check); a change that changes nothing writes nothing and says so."""
        if etag_of(new) == rev.etag:
            log.info("change_unchanged", model=rev.name, kind=kind, revision=rev.revision)
            return Applied(rev, "", 0, unchanged=True)
        old = rev.model
        changed = changed_profiles(old, new.model)
        state = self._view()
        check_room(old, new.model, changed, options.strategy, state.nodes, state.replicas)
        wanted_old = {w.profile: w for w in wants_of([rev])}
        restarted = sum(
            1
            for r in state.replicas.values()
            if r.model == old.name and r.profile in changed and not r.retire
        )
        if options.dry_run:
            return Applied(self._catalog.preview(new, options.by), "", restarted)
        running = self._active(old.name)
        if running is not None and options.supersede:
            self._request_cancel(running, "superseded by a newer change of the model", options.by)
        committed = self._catalog.write(new, options.by, rev.revision)
        steps = plan_steps(old.name, changed, state.replicas, wants_of([committed]))
        if not steps:
            return Applied(committed, "", 0)
        canary = None
        if options.strategy is Strategy.CANARY:
            canary = CanaryRun(policy=options.canary or Policy())
            steps = mark_canaries(steps)
        ro = Rollout(
            id="ro-" + uuid.uuid4().hex[:10],
            model=old.name,
            kind=kind,
            strategy=options.strategy,
            from_revision=rev.revision,
            to_revision=committed.revision,
            steps=steps,
            surge=max(options.surge, 1),
            created_s=self._clock(),
            by=options.by,
            undo_of=undo_of,
            start_timeout_s=self._controller.start_timeout_s,
            old_specs={name: replace(w.spec, want=w.want) for name, w in wanted_old.items()},
            state=RolloutState.PENDING,
            updated_s=self._clock(),
            trace=self._trace_context(),
            canary=canary,
        )
        self._store.put_rollout(rollout_record(ro))
        state.handed.append(ro.id)
        log.info("change_applied", model=old.name, kind=kind, rollout_id=ro.id, steps=len(steps))
        return Applied(committed, ro.id, restarted)
