"""Request ids' answers: a mutation is made once per request id, its answer stored with its
writes in one transaction and given again to a retry of the same request."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from fleet_svc.domain import errors
from fleet_svc.store.base import AnswerRecord, Store

log = structlog.get_logger(__name__)

REQUEST_ID_WINDOW_S = 24 * 3600.0
"""How long a request id is remembered by default: a day, well past any client's retries."""
PRUNE_EVERY_S = 60.0
"""How often a change also forgets the answers older than the window (a DELETE over the
answers' age index): not at every change, since an id past its window is new again whether
its row is gone yet or not."""


class _Raced(Exception):
    """Another attempt with the same request id claimed it first (inside Answers.commit)."""


class Answers:
    """The first answer to each request id, kept in the store for `window_s`."""

    def __init__(self, store: Store, clock: Callable[[], float], window_s: float) -> None:
        self._store = store
        self._clock = clock
        self.window_s = window_s
        """How long a request id's first answer is kept (a retry within it is answered so)."""
        self._pruned_s: float | None = None
        """When answers past the window were last forgotten (None: not yet)."""

    def replay(
        self,
        request_id: str,
        method: str,
        fingerprint: str,
        still_true: Callable[[bytes], bool] = lambda _answer: True,
    ) -> bytes | None:
        """The first answer to this request when one is kept and still holds, else None (a
        look before the change is prepared; `commit` looks again inside its transaction).

        Raises:
            RequestIdReused: the id was used for another method or another request.
        """
        if not request_id:
            return None
        stored = self._answered(request_id, method, fingerprint)
        return stored if stored is not None and still_true(stored) else None

    def commit(
        self,
        request_id: str,
        method: str,
        fingerprint: str,
        commit: Callable[[], bytes],
        still_true: Callable[[bytes], bool] = lambda _answer: True,
        *,
        checked_at_commit: bool = False,
    ) -> bytes:
        """Run `commit` (the change's writes, returning its encoded answer) and keep the
        answer under `request_id`, in one store transaction, so a crash keeps both or neither.

        The id is checked again inside that transaction, so two attempts racing with one id
        make one change. Ids are kept for `window_s` after their first answer; an older one is
        new again, and so is one whose answer `still_true` says no longer holds (the model it
        answered about was deleted since): a replay never says "created" of a model that is
        not there.

        Args:
            request_id: the caller's id ("" makes every call a new one).
            method: the RPC's name.
            fingerprint: a hash of the request without its id (rpc layer): the same id with
                another fingerprint is another request.
            commit: makes the change and encodes the answer.
            still_true: whether a stored answer may be given again (rpc layer, which can read
                it: `FleetApp.deleted_since` of the model it names).
            checked_at_commit: the transaction's checks (the id's claim among them) may be
                put off to its commit (Store.atomic): the id is taken to be new until then.

        Raises:
            RequestIdReused: the id was used for another method or another request.
            ChecksFailed: with `checked_at_commit`, a check did not hold at the commit
                (nothing kept): run it again without.
        """
        try:
            with self._store.atomic(checked_at_commit=checked_at_commit):
                if not request_id:
                    return commit()
                self._prune()
                # Claimed at once in the common case (a new id): no read first.
                if not self._store.claim_answer(request_id, method, fingerprint):
                    stored = self._store.get_answer(request_id)
                    if stored is None:
                        raise _Raced  # forgotten since the claim saw it: rare
                    if self._fresh(stored):
                        answer = self._matching(stored, request_id, method, fingerprint)
                        if still_true(answer):
                            return answer
                    # Past the window (not pruned yet), or its model was deleted since: the id
                    # is new again, its old answer gone.
                    log.info("request_answer_outdated", method=method, request_id=request_id)
                    self._store.forget_answer(request_id)
                    if not self._store.claim_answer(request_id, method, fingerprint):
                        raise _Raced
                answer = commit()
                self._store.put_answer(request_id, method, answer, fingerprint=fingerprint)
                return answer
        except _Raced:
            # Another attempt with this id committed while this one waited: its answer.
            first = self._answered(request_id, method, fingerprint)
            if first is None:
                raise errors.RequestIdReused(
                    f"request id {request_id!r} is being answered by another attempt: retry it",
                    request_id=request_id,
                    method=method,
                ) from None
            return first

    def _prune(self) -> None:
        """Forget answers older than the window, at most every PRUNE_EVERY_S."""
        now = self._clock()
        if self._pruned_s is not None and 0 <= now - self._pruned_s < PRUNE_EVERY_S:
            return
        self._store.prune_answers(now - self.window_s)
        self._pruned_s = now

    def _answered(self, request_id: str, method: str, fingerprint: str) -> bytes | None:
        """The first answer to `request_id` when it is this request's, None when the id is new
        (or older than the window).

        Raises:
            RequestIdReused: the id answered another method or another request.
        """
        stored = self._store.get_answer(request_id)
        if stored is None or not self._fresh(stored):
            return None
        return self._matching(stored, request_id, method, fingerprint)

    def _fresh(self, stored: AnswerRecord) -> bool:
        """Whether a stored answer is within the window."""
        return stored.created_at >= self._clock() - self.window_s

    @staticmethod
    def _matching(stored: AnswerRecord, request_id: str, method: str, fingerprint: str) -> bytes:
        """A stored answer when it is this request's.

        Raises:
            RequestIdReused: the id answered another method or another request.
        """
        if stored.method != method:
            raise errors.RequestIdReused(
                f"request id {request_id!r} was used for {stored.method}: use a new id",
                request_id=request_id,
                method=stored.method,
            )
        if stored.fingerprint != fingerprint:
            raise errors.RequestIdReused(
                f"request id {request_id!r} was used for another {method} request: use a new id"
                " for a new request, and the same id only to retry the same request",
                request_id=request_id,
                method=stored.method,
            )
        log.info("request_replayed", method=method, request_id=request_id)
        return stored.answer
