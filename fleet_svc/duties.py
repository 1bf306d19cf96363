"""What a fleet does as leader and as follower: run the controller, or follow the store.

A fleet on a store without a lease (SQLite: one fleet per file) always leads. On a leased store
(PostgreSQL) it leads only while its Leadership holds the lease: then it loads the state its
predecessor left, writes the settings file's models and runs the controller, which hears the
agents' streams held here directly; deposed, it stops the controller and, like every follower,
reads the replicas and rollouts again whenever the store notifies it that the leader wrote some
(PostgreSQL's LISTEN/NOTIFY), so its reads and watches show what the leader wrote. Leading or
not, it serves agents' streams (`Agents`: fleet_svc.rpc.agent_relay), and a change of leader
ends none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Protocol

import structlog

from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain.catalog import Entry
from fleet_svc.leadership import Leadership
from fleet_svc.store.base import DESIRED, NotLeader, StoreError

log = structlog.get_logger(__name__)

FOLLOW_S = 5.0
"""Besides the store's notifications, how often a follower asks the store whether replicas or
rollouts changed (the server's digest of them) and, when they did, reads them: a safety net
for a notification lost (the listener reconnects, and reads once when it does)."""


class Agents(Protocol):
    """The agents' streams this fleet holds (fleet_svc.rpc.agent_relay.NodeRelay)."""

    def lead(self, controller: Controller) -> None:
        """This fleet leads: its controller hears the streams."""

    def follow(self) -> None:
        """This fleet follows: the streams go through the store."""

    def notified(self) -> None:
        """The store said the leader wrote."""


class _NoAgents:
    def lead(self, controller: Controller) -> None:
        pass

    def follow(self) -> None:
        pass

    def notified(self) -> None:
        pass


class Duties:
    """Runs the controller while this fleet leads, follows the store while it does not."""

    def __init__(
        self,
        controller: Controller,
        catalog: Catalog,
        leadership: Leadership | None = None,
        *,
        declared: Sequence[Entry] = (),
        settings_path: str = "",
        follow_s: float = FOLLOW_S,
        agents: Agents | None = None,
    ) -> None:
        self.controller = controller
        self.agents: Agents = agents or _NoAgents()
        self.catalog = catalog
        self.leadership = leadership
        self._declared = tuple(declared)
        self._settings_path = settings_path
        self._follow_s = follow_s
        self._task: asyncio.Task[None] | None = None
        """The controller's loop while leading, the follower's loop while not."""
        self._lease_task: asyncio.Task[None] | None = None
        self._failing = ""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The controller's loop while leading, the follower's loop while not."""
        return self._task

    @property
    def is_leader(self) -> bool:
        """Whether this fleet leads now (always, on a store without a lease)."""
        return self.leadership is None or self.leadership.is_leader

    @property
    def epoch(self) -> int:
        """The epoch this fleet leads at: 0 while it follows, and on a store without a lease."""
        return 0 if self.leadership is None else self.leadership.epoch

    def refusal(self) -> NotLeader | None:
        """What a call needing the leader is told here; None while this fleet leads."""
        return None if self.leadership is None else self.leadership.refusal()

    async def start(self) -> None:
        """Lead at once (no lease), or try for the lease once and go on from the answer."""
        leadership = self.leadership
        if leadership is None:
            self._declare()
            self.agents.lead(self.controller)
            self._task = asyncio.create_task(self.controller.run())
            return
        leadership.on_elected = self._elected
        leadership.on_deposed = self._deposed
        self.controller.leading = lambda: leadership.is_leader
        self.controller.on_fenced = leadership.deposed
        await leadership.attempt()
        if not leadership.is_leader:
            self._deposed("another fleet leads")
        self._lease_task = asyncio.create_task(leadership.run())

    def _declare(self) -> None:
        if self._settings_path:
            self.catalog.declare(self._declared, self._settings_path)

    async def _elected(self, epoch: int) -> None:
        """Take over: load the state off the loop (Controller.reload), then hear the agents,
        write the settings file's models (on the controller's thread: before its first tick,
        in order with its writes) and run the controller."""
        self._cancel()
        self.catalog.forget_wants()  # another fleet may have changed the catalog meanwhile
        await self.controller.reload()
        self.agents.lead(self.controller)
        try:
            await self.controller.calls.run(self._declare)
        except StoreError as exc:
            log.error("declared_models_not_written", problem=exc.problem)
        self._task = asyncio.create_task(self.controller.run())

    def _deposed(self, why: str) -> None:
        self._cancel()
        self.agents.follow()
        self._task = asyncio.create_task(self._follow())

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _follow(self) -> None:
        """Read the store whenever it notifies a write, and at least every FOLLOW_S when its
        digest moved, until cancelled (one log line per change of problem)."""
        loop = asyncio.get_running_loop()
        notified = asyncio.Event()
        state_moved = True
        """Whether a notification since the last read said replicas or rollouts changed (one
        for desired sets only needs no read of them: the relay forwards the sets)."""
        stop = threading.Event()
        listening = None
        if self.leadership is not None:

            def told(payload: str) -> None:  # on the loop
                nonlocal state_moved
                state_moved = state_moved or payload != DESIRED
                notified.set()

            def changed(payload: str) -> None:  # on the listener's thread
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(told, payload)

            listening = loop.run_in_executor(None, self.leadership.listen, changed, stop)
        digest = None
        try:
            while True:
                woken = notified.is_set()
                moved, state_moved = state_moved, False
                notified.clear()
                try:
                    if woken:
                        self.agents.notified()  # desired sets first: agents wait on them
                    # Without a notification, the rows are read again only when the server's
                    # digest of them moved: one small query per FOLLOW_S while nothing changes.
                    # The store is read on a thread (a leased store is PostgreSQL: its calls
                    # may come from any thread), so the streams this fleet holds go on.
                    leadership = self.leadership
                    if woken or leadership is None:
                        now, read = None, moved or leadership is None
                    else:
                        now = await asyncio.to_thread(leadership.state_digest)
                        read = now != digest
                    if read:
                        self.agents.notified()
                        self.controller.follow(await asyncio.to_thread(self.controller.followed))
                        digest = now
                    if self._failing:
                        log.info("follow_recovered")
                        self._failing = ""
                except StoreError as exc:
                    state_moved = state_moved or moved  # read them once the store answers
                    if exc.problem != self._failing:
                        log.warning("follow_failed", problem=exc.problem)
                        self._failing = exc.problem
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(notified.wait(), self._follow_s)
        finally:
            stop.set()
            if listening is not None:
                listening.cancel()

    async def stop(self) -> None:
        """Stop leading (ending the lease at once, so another need not wait it out) and stop
        the loops; a leader writes what it still held first."""
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.is_leader:
            try:
                await self.controller.flush()
            except StoreError as exc:
                log.warning("final_flush_failed", problem=exc.problem)
        if self.leadership is not None:
            self.leadership.on_deposed = lambda why: None
            await self.leadership.release()
