"""The application layer's guards and reads: a mutation answered once per request id, its
transaction on the store's threads reading a view of the controller taken on the loop, the
checks every change of a model passes, and what the API reads of the catalog and rollouts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from fleet_svc.answers import REQUEST_ID_WINDOW_S, Answers
from fleet_svc.app.values import ACTIVE, ADOPT_WAIT_S, CURRENT_VIEW, T, View, in_view
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Revision
from fleet_svc.domain.control import cards_in_use
from fleet_svc.domain.rollout import Rollout, RolloutEvent, RolloutState
from fleet_svc.planner import Planner
from fleet_svc.store.base import ChecksFailed, Store, StoreError
from fleet_svc.store.rows import load_event, load_rollout
from fleet_svc.store_calls import StoreCalls
from llmgw.model import Inventory, Node

log = structlog.get_logger(__name__)


class GuardedApp:
    """What every change goes through: the request id answered once, the view of the
    controller it reads, the guards on the model; and the reads (fleet_svc.app.changes.FleetApp
    adds the changes)."""

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
        """The answer to a mutation, made once per request id (fleet_svc.answers: `commit` on
        the store's threads); a change it hands the controller is waited for.

        The id is looked up inside the commit's transaction (its claim), not before: a new id,
        the common case, costs no read of its own. A retry is prepared again (its planner call
        answered from the planner's memory) and then given its first answer; when preparing
        it fails (its first attempt started a rollout, the planner is down), the id's first
        answer is given if there is one, else the failure.

        Raises:
            RequestIdReused: the id was used for another method or another request.
        """
        try:
            commit = await prepare()
        except Exception:
            if request_id:
                stored = await self.calls.run(
                    self._answers.replay, request_id, method, fingerprint, still_true
                )
                if stored is not None:
                    return stored
            raise
        view = self._view()
        try:
            answer, written = await self.calls.run(
                self._commit, request_id, method, fingerprint, commit, view, still_true
            )
        except BaseException:
            # A commit that failed as it ended may have committed: the wants are read again.
            self._catalog.forget_wants()
            raise
        if view.handed:
            await self._controller.adopted(self._controller.changed(), ADOPT_WAIT_S)
        else:
            # The wants changed (replicas to add or remove), and nothing waits in the store
            # for the revisions written: the controller need not look there for them.
            self._controller.handed_nothing((r.name, r.revision) for r in written)
        return answer

    async def dry(self, prepare: Callable[[], Awaitable[Callable[[], T]]]) -> T:
        """The answer to a dry run: `prepare`'s commit, run outside any transaction (it writes
        nothing) on the store's threads like a change."""
        commit = await prepare()
        return await self.calls.run(in_view, commit, self._view())

    def _commit(
        self,
        request_id: str,
        method: str,
        fingerprint: str,
        commit: Callable[[], bytes],
        view: View,
        still_true: Callable[[bytes], bool],
    ) -> tuple[bytes, list[Revision]]:
        """Run `commit` and keep the request id's answer, in one transaction, reading `view`;
        the answer and the catalog revisions committed (taken into the controller's wants
        once the transaction committed: Catalog.deferred).

        The transaction is first sent with its checks put off to its commit (one round trip
        on PostgreSQL for a change that reads nothing more). When one did not hold (the id
        was answered, the model changed, the lease moved: ChecksFailed), nothing was kept,
        and it is run again checking as it goes, which gives the answer or the refusal. A
        change refused while its id was taken to be new is a retry's first answer when the id
        has one (as when preparing it fails: `once`)."""
        CURRENT_VIEW.set(view)
        try:
            with self._catalog.deferred() as written:
                answer = self._answers.commit(
                    request_id, method, fingerprint, commit, still_true, checked_at_commit=True
                )
        except ChecksFailed:
            log.debug("change_checked_again", method=method)
            view.handed.clear()  # what the first try handed over was not kept
            with self._catalog.deferred() as written:
                answer = self._answers.commit(request_id, method, fingerprint, commit, still_true)
        except StoreError:
            raise
        except Exception:
            stored = (
                self._answers.replay(request_id, method, fingerprint, still_true)
                if request_id
                else None
            )
            if stored is None:
                raise
            return stored, []
        self._catalog.committed(written)
        return answer, written

    def _view(self) -> View:
        """What a change reads of the controller: inside FleetApp.once the view it took on
        the loop, else (a call on the loop) the controller's own maps."""
        view = CURRENT_VIEW.get(None)
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
        rev, active = self._catalog.to_change(name, ACTIVE)
        self._not_declared(name)
        if etag and etag != rev.etag:
            raise errors.StaleRevision(
                f"model {name!r} changed since etag {etag} was read (now revision "
                f"{rev.revision}, etag {rev.etag}): read it again and retry",
                name=name,
                expected=etag,
                current=rev.etag,
            )
        running = load_rollout(active[0]) if active else None
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

    def rollout_events(self, rollout_id: str, after_seq: int = 0) -> list[RolloutEvent]:
        """A rollout's stored events after `after_seq`, in order."""
        return [load_event(rec) for rec in self._store.list_events(rollout_id, after_seq)]

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
