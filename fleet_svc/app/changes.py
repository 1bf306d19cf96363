"""The application layer's changes: the catalog's (create, update, delete), the planned
ones (SetContext, SetGPUs), and the rollouts' controls (undo, cancel, promote, the gateways'
traffic); each committed with its rollout or request for the controller in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace

import structlog

from fleet_svc.app.guarded import GuardedApp
from fleet_svc.app.values import TRAFFIC_KEPT_S, Applied, ChangeOptions
from fleet_svc.domain import errors
from fleet_svc.domain.asked import ContextAsk, GPUsAsk, context_asked, gpus_asked
from fleet_svc.domain.canary import CanaryRun, Policy
from fleet_svc.domain.catalog import Entry, Revision, changed_profiles, check_profiles, wants_of
from fleet_svc.domain.rollout import Rollout, RolloutState, Strategy, mark_canaries, plan_steps
from fleet_svc.domain.room import check_room
from fleet_svc.domain.traffic import EndpointReport, check_report
from fleet_svc.planner import Planned
from fleet_svc.store.base import RolloutRequest, TrafficRecord
from fleet_svc.store.canary_rows import histogram_doc
from fleet_svc.store.catalog_rows import etag_of
from fleet_svc.store.rows import load_rollout, rollout_record
from llmgw.model import Model

log = structlog.get_logger(__name__)


class FleetApp(GuardedApp):
    """The catalog's changes, SetContext, SetGPUs and the rollouts' controls."""

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
        self, name: str, ask: ContextAsk, *, etag: str, options: ChangeOptions
    ) -> tuple[Planned, Callable[[], Applied]]:
        """Size a new context (and batch) with the planner; the commit rolls it out (checked
        again).

        Returns:
            The planner's answer, and the commit (FleetApp.once runs it in one transaction).

        Raises:
            ModelNotFound, ModelDeclared, StaleRevision, RolloutInProgress, NoRoomBeside,
            NoRoomInPlace,
            PlannerUnavailable, and the planner's refusals.
        """
        rev = await self.calls.run(self._changeable, name, etag, supersede=options.supersede)
        planned = await self.planner.size_context(rev.entry, self.inventory(), ask)
        # A no-op by what was asked: the planner's filled-in values are not written then.
        new = rev.model
        if context_asked(rev.model, ask):
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
        self, name: str, ask: GPUsAsk, *, etag: str, options: ChangeOptions
    ) -> tuple[Planned, Callable[[], Applied]]:
        """Plan `gpus` cards a replica with the planner; the commit rolls it out (as
        prepare_context).

        Raises:
            as prepare_context.
        """
        rev = await self.calls.run(self._changeable, name, etag, supersede=options.supersede)
        planned = await self.planner.plan_gpus(rev.entry, self.inventory(), ask)
        asked = gpus_asked(rev.model, ask)
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

        The revision written is the one after `read`'s, by compare-and-swap (Store.put_model):
        a change committed meanwhile (a rollout started with it) makes it StaleRevision, so
        the model is not read again first. A change that writes nothing, or a dry run, has no
        such guard and reads it again.

        Raises:
            InvalidModel: the planner's profiles are not ones the fleet can run.
            StaleRevision, ModelDeclared, RolloutInProgress, ModelNotFound.
        """
        check_profiles(new)
        self._not_declared(read.name)
        entry = read.entry.with_model(new)
        rev = read
        if options.dry_run or etag_of(entry) == read.etag:
            rev = self._changeable(read.name, read.etag, supersede=options.supersede)
        return self._apply(rev, entry, kind, options)

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
        # Without supersede, _changeable refused a running rollout already, in this transaction.
        running = self._active(old.name) if options.supersede else None
        if running is not None:
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
