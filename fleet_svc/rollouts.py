"""The running rollouts: taken up from the store (the API side commits them PENDING, with
its requests to cancel them), advanced and cancelled by the pure functions of domain.rollout,
stored with their events, and a signal for those who watch them. Their store calls run through
the controller's StoreCalls (off the loop on PostgreSQL), one at a time and in order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import replace

import structlog

from fleet_svc.domain.canary import split_weights
from fleet_svc.domain.canary_steps import promote as promote_canary
from fleet_svc.domain.canary_steps import step_on, window_start
from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import Action
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import (
    ENDINGS,
    Event,
    EventKind,
    Rollout,
    RolloutState,
    Stage,
    in_canary,
)
from fleet_svc.domain.rollout_run import advance as advance_rollout
from fleet_svc.domain.rollout_run import cancel as cancel_rollout
from fleet_svc.store.base import RolloutRecord, RolloutRequest, Store
from fleet_svc.store.canary_rows import revision_figures
from fleet_svc.store.rows import event_doc, load_rollout, rollout_record
from fleet_svc.store_calls import StoreCalls
from llmgw.clock import Clock

log = structlog.get_logger(__name__)

PROMOTIONS = frozenset({"promote", "promote_full"})
"""Kinds of rollout requests that promote a canary (every other kind cancels)."""


class Rollouts:
    """Running rollouts by id, and the store of every rollout's state and events."""

    def __init__(
        self, store: Store, calls: StoreCalls, clock: Clock, new_id: Callable[[], str]
    ) -> None:
        self._store = store
        self._calls = calls
        self._clock = clock
        self._new_id = new_id
        self.running: dict[str, Rollout] = {}
        self.signal = asyncio.Event()
        """Set (and replaced) whenever a rollout records events."""
        self.saves = 0
        """Counts rollout writes (the controller ticks again after one)."""
        self.on_end: list[Callable[[Rollout], None]] = []
        """Called with each rollout as it ended (succeeded, failed or cancelled), once it is
        stored: how metrics (fleet_svc/metrics.py) count outcomes without the loop knowing."""
        self.on_event: list[Callable[[Rollout, Event], None]] = []
        """Called with each event a rollout records, once stored (metrics count a canary's
        verdicts so)."""
        self._seen: dict[str, float] = {}
        """Rollout id -> when it last changed, as `follow` last read it."""
        self.settle: set[str] = set()
        """Models whose canary's weights may have changed since the controller last
        published them (a step began, the canary ended or was promoted)."""

    def load(self, rows: list[RolloutRecord]) -> None:
        """The rollouts running when the fleet stopped, from every rollout's row; a starting
        step gets its whole start timeout again (the monotonic time it started at is gone with
        the old process)."""
        now = self._clock.monotonic()
        self.running = {}
        self._seen = {}
        for stored in rows:
            if stored.state == "RUNNING":
                ro = load_rollout(stored)
                steps = tuple(
                    replace(s, started_s=now) if s.stage is Stage.STARTING else s for s in ro.steps
                )
                self.running[stored.id] = replace(ro, steps=steps)
                if ro.canary is not None:
                    self.settle.add(ro.model)

    def follow(self, stored: list[RolloutRecord]) -> None:
        """Take the running rollouts from the store's rows (a fleet that does not lead:
        another writes them), waking watchers when any rollout changed since the last read."""
        seen = {r.id: r.updated_at for r in stored}
        before = self.running
        self.running = {r.id: load_rollout(r) for r in stored if r.state == "RUNNING"}
        for ro in [*before.values(), *self.running.values()]:
            if ro.canary is not None:
                self.settle.add(ro.model)
        if seen != self._seen:
            self._seen = seen
            signal, self.signal = self.signal, asyncio.Event()
            signal.set()

    @property
    def managed(self) -> frozenset[tuple[str, str]]:
        """(model, profile) pairs a running rollout is changing: their counts are its own."""
        return frozenset((ro.model, s.profile) for ro in self.running.values() for s in ro.steps)

    def of_model(self, model: str) -> Rollout | None:
        """The rollout changing `model` now, if any."""
        return next((ro for ro in self.running.values() if ro.model == model), None)

    async def adopt(
        self, wants: list[ProfileWant], replicas: Mapping[str, ReplicaState]
    ) -> list[Action]:
        """Take up what the API side committed: its requests to cancel a rollout first, then
        the pending rollouts, oldest first; the actions that stop what a cancel ends.

        A pending rollout runs when the catalog's current revision of its model (in `wants`)
        is the one it carries out, cancelling a running rollout of the same model (the change
        superseded it); one of an older revision, or of a model gone, ends CANCELLED without
        starting. One of a revision newer than `wants` (committed after they were read) waits
        for the next tick. Each request is forgotten once carried out.
        """
        requests, stored = await self._calls.run(self._committed)
        pending = {rec.id: load_rollout(rec) for rec in reversed(stored)}
        out: list[Action] = []
        for req in requests:
            if req.kind in PROMOTIONS:
                await self._promote(req.rollout_id, full=req.kind == "promote_full", by=req.by)
            elif req.rollout_id in self.running:
                out.extend((await self.cancel(req.rollout_id, req.reason, replicas))[1])
            elif req.rollout_id in pending:
                await self._end_unstarted(pending.pop(req.rollout_id), req.reason)
        current = {w.model: w.revision for w in wants}
        for ro in pending.values():
            revision = current.get(ro.model, 0)
            if revision and ro.to_revision > revision:
                continue
            if revision != ro.to_revision:
                held = f"revision {revision}" if revision else "no revision"
                await self._end_unstarted(
                    ro, f"the catalog holds {held} of {ro.model}, not {ro.to_revision}"
                )
                continue
            running = self.of_model(ro.model)
            if running is not None:
                reason = f"superseded by rollout {ro.id}, a newer change of the model"
                out.extend((await self.cancel(running.id, reason, replicas))[1])
            await self._start(replace(ro, state=RolloutState.RUNNING))
        if requests:
            await self._calls.run(self._store.delete_rollout_requests, [r.id for r in requests])
        return out

    def _committed(self) -> tuple[list[RolloutRequest], list[RolloutRecord]]:
        """The API side's requests and its pending rollouts (store calls only)."""
        return (
            self._store.list_rollout_requests(),
            self._store.list_rollouts(states=(RolloutState.PENDING.value,)),
        )

    async def _promote(self, rollout_id: str, *, full: bool, by: str) -> None:
        """Carry out an operator's promotion of a running canary (else nothing)."""
        ro = self.running.get(rollout_id)
        if ro is None:
            return
        promoted, events = promote_canary(ro, full=full, by=by, now_wall=self._clock.wall())
        if events:
            self.running[rollout_id] = await self.save(promoted, events)
            log.info("canary_promoted", rollout_id=rollout_id, full=full, by=by)

    def weights(
        self, model: str
    ) -> Callable[[Mapping[str, tuple[int, int]]], dict[str, int]] | None:
        """How the weights of a model's routable endpoints are split (fleet_svc.watch.Weigher):
        by its canary's step while one is judged; None (their own) otherwise."""
        ro = self.of_model(model)
        if ro is None or ro.canary is None or not in_canary(ro):
            return None
        return functools.partial(
            split_weights, new_revision=ro.to_revision, percent=ro.canary.weight_percent
        )

    async def _judge(
        self, ro: Rollout, replicas: Mapping[str, ReplicaState], now_s: float
    ) -> tuple[Rollout, list[Action], list[Event]]:
        """A canary's step moved on by the traffic the gateways reported for its window."""
        since = window_start(ro)
        records = (
            await self._calls.run(self._store.list_traffic, ro.model, int(since * 1000))
            if since > 0
            else []
        )
        canary, baseline = revision_figures(records, ro.to_revision)
        return step_on(
            ro, canary, baseline, self._clock.wall(), replicas, now_s, new_id=self._new_id
        )

    async def _start(self, ro: Rollout) -> None:
        """Store a rollout as running (it was pending)."""
        started = Event(EventKind.ROLLOUT_STARTED, message=f"{ro.kind}: {ro.strategy.value}")
        ro = await self.save(ro, [started])
        self.running[ro.id] = ro
        log.info("rollout_started", rollout_id=ro.id, model=ro.model, steps=len(ro.steps))

    async def _end_unstarted(self, ro: Rollout, reason: str) -> None:
        """End a pending rollout CANCELLED before any of its steps began."""
        steps = tuple(replace(s, stage=Stage.CANCELLED) for s in ro.steps)
        ended = replace(ro, state=RolloutState.CANCELLED, reason=reason, steps=steps)
        ended = await self.save(ended, [Event(EventKind.ROLLOUT_CANCELLED, message=reason)])
        log.info("rollout_cancelled", rollout_id=ro.id, reason=reason, started=False)
        self._ended(ended)

    async def cancel(
        self, rollout_id: str, reason: str, replicas: Mapping[str, ReplicaState]
    ) -> tuple[Rollout | None, list[Action]]:
        """End a running rollout; it as it ended (None when not running) and the actions that
        stop its in-flight replica."""
        ro = self.running.pop(rollout_id, None)
        if ro is None:
            return None, []
        ended, actions, events = cancel_rollout(
            ro, reason, replicas, self._clock.monotonic(), new_id=self._new_id
        )
        log.info("rollout_cancelled", rollout_id=rollout_id, reason=reason)
        ended = await self.save(ended, events)
        self._ended(ended)
        return ended, actions

    async def save(self, ro: Rollout, events: list[Event]) -> Rollout:
        """Store a rollout (stamped with the wall time) and its new events, each with the state
        right after it (RUNNING until the ending event, which carries the end state); wake its
        watchers once stored."""
        self.saves += 1
        if ro.canary is not None:
            self.settle.add(ro.model)
        wall = self._clock.wall()
        ro = replace(ro, updated_s=wall)
        await self._calls.run(self._write, ro, events, wall)
        if events:
            signal, self.signal = self.signal, asyncio.Event()
            signal.set()
        for e in events:
            for listener in self.on_event:
                try:
                    listener(ro, e)
                except Exception:  # an observer's bug must not stop the controller
                    log.exception("rollout_listener_failed", rollout_id=ro.id)
        return ro

    def _write(self, ro: Rollout, events: list[Event], wall: float) -> None:
        """The store calls of `save`: the rollout's row, then its events in order."""
        self._store.put_rollout(rollout_record(ro))
        for e in events:
            state = ro.state if e.kind in ENDINGS else RolloutState.RUNNING
            self._store.append_event(ro.id, wall, event_doc(e, state))

    def _ended(self, ro: Rollout) -> None:
        for listener in self.on_end:
            try:
                listener(ro)
            except Exception:  # an observer's bug must not stop the controller
                log.exception("rollout_listener_failed", rollout_id=ro.id)

    async def advance(
        self,
        now_s: float,
        wants: list[ProfileWant],
        replicas: Mapping[str, ReplicaState],
        nodes: Mapping[str, NodeView],
        logs: Mapping[str, tuple[str, ...]],
    ) -> list[Action]:
        """Move every running rollout on; the actions they take, in order."""
        by_key = {(w.model, w.profile): w for w in wants}
        out: list[Action] = []
        for ro in list(self.running.values()):
            current = next((w.revision for w in wants if w.model == ro.model), 0)
            if current != ro.to_revision:
                # The catalog does not hold the revision this rollout carries out (the fleet
                # died between the two writes, or the model was deleted): end it, say so.
                ended, actions, events = cancel_rollout(
                    ro,
                    f"the catalog holds revision {current} of {ro.model}, not {ro.to_revision}",
                    replicas,
                    now_s,
                    new_id=self._new_id,
                )
            else:
                ended, actions, events = advance_rollout(
                    ro, replicas, by_key, nodes, now_s, new_id=self._new_id, logs=logs
                )
                if in_canary(ended) and not ended.done:
                    ended, more, judged = await self._judge(ended, replicas, now_s)
                    actions, events = [*actions, *more], [*events, *judged]
            if events or ended != ro:
                ended = await self.save(ended, events)
            out.extend(actions)
            if ended.done:
                del self.running[ro.id]
                log.info(
                    "rollout_ended", rollout_id=ro.id, state=ended.state.value, reason=ended.reason
                )
                self._ended(ended)
            else:
                self.running[ro.id] = ended
        return out
