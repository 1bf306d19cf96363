"""The catalog in the store: models as revisions, the ones the settings file declares, and
the profiles' wanted replicas for the controller. It reads and writes; whether a change is
allowed is the application layer's business (fleet_svc.app)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import structlog

from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Entry, ProfileWant, Revision, wants_of
from fleet_svc.store.base import RolloutRecord, StaleRevision, Store, StoreError
from fleet_svc.store.catalog_rows import record_of, revision_of
from llmgw.model import Model

log = structlog.get_logger(__name__)

REVISIONS_KEPT = 256
"""Past revisions `model_at` keeps read (a revision never changes once written)."""

_WRITTEN: contextvars.ContextVar[list[Revision]] = contextvars.ContextVar("catalog_written")
"""The revisions written inside `Catalog.deferred` (a change's transaction), not yet
committed."""


class Catalog:
    """Reads and writes the catalog; every change is a new revision with who and when."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self.declared: dict[str, str] = {}
        """Declared model name -> the settings file that declares it."""
        self._wants: list[ProfileWant] | None = None
        self._revisions: dict[tuple[str, int], Model | None] = {}
        self._lock = threading.Lock()
        """Guards the two caches: the API's threads write the catalog while the controller's
        reads the wants (on PostgreSQL each on threads of their own)."""
        self._generation = 0
        """Counts the times the wants were forgotten or changed: wants read across one are
        not kept."""
        self._kept_revisions: dict[str, int] = {}
        """Model -> the revision the kept wants hold of it (a deletion's included)."""

    def find(self, name: str) -> Revision | None:
        """The model's latest revision, None when absent or deleted."""
        record = self._store.get_model(name)
        return None if record is None else revision_of(record)

    def get(self, name: str) -> Revision:
        """The model's latest revision.

        Raises:
            ModelNotFound: absent or deleted.
        """
        found = self.find(name)
        if found is None:
            raise errors.ModelNotFound(f"no model {name!r} in the catalog", name=name)
        return found

    def to_change(self, name: str, states: Sequence[str]) -> tuple[Revision, list[RolloutRecord]]:
        """The model's latest revision and its rollouts in `states`, newest first, read at
        once (what a change checks first: Store.model_to_change).

        Raises:
            ModelNotFound: absent or deleted.
        """
        record, rollouts = self._store.model_to_change(name, states)
        if record is None:
            raise errors.ModelNotFound(f"no model {name!r} in the catalog", name=name)
        return revision_of(record), rollouts

    def model_at(self, name: str, revision: int) -> Model | None:
        """The model as its revision `revision` was (None: no such revision, or the store
        cannot be read now: the caller goes on without it)."""
        key = (name, revision)
        if key not in self._revisions:
            try:
                history = self._store.model_history(name)
            except StoreError as exc:
                log.warning("revision_unread", model=name, revision=revision, error=str(exc))
                return None
            found = next((r for r in history if r.revision == revision), None)
            self._remember(key, None if found is None else revision_of(found).model)
        return self._revisions.get(key)

    def _remember(self, key: tuple[str, int], model: Model | None) -> None:
        with self._lock:
            if key not in self._revisions and len(self._revisions) >= REVISIONS_KEPT:
                self._revisions.pop(next(iter(self._revisions)))
            self._revisions[key] = model

    def all(self) -> list[Revision]:
        """Every current model."""
        return [revision_of(r) for r in self._store.list_models()]

    def history(self, name: str) -> list[Revision]:
        """Every revision of a model.

        Raises:
            ModelNotFound: it never existed.
        """
        records = self._store.model_history(name)
        if not records:
            raise errors.ModelNotFound(f"no model {name!r} in the catalog", name=name)
        return [revision_of(r) for r in records]

    def last_revision(self, name: str) -> int:
        """The model's last revision, a deletion's included (0 when it never existed)."""
        history = self._store.model_history(name)
        return history[-1].revision if history else 0

    def preview(self, entry: Entry, by: str) -> Revision:
        """`entry` as a dry run answers it: not written, so revision 0 and no etag (a dry run
        never predicts the etag or revision a later write gets)."""
        return Revision(entry, 0, by, self._clock())

    def write(
        self,
        entry: Entry,
        by: str,
        expect: int,
        *,
        deleted: bool = False,
        declared_in: str = "",
    ) -> Revision:
        """Write `entry` as the revision after `expect`, atomically.

        Raises:
            StaleRevision: another write came first.
        """
        rev = Revision(
            entry=entry,
            revision=expect + 1,
            updated_by=by,
            updated_at=self._clock(),
            deleted=deleted,
            declared_in=declared_in,
        )
        try:
            stored = self._store.put_model(record_of(rev), expect_revision=expect)
        except StaleRevision as exc:
            raise errors.StaleRevision(
                f"model {entry.name!r} changed since it was read (now revision {exc.current}): "
                "read it again and retry",
                name=entry.name,
                expected=str(expect),
                current=self._etag_now(entry.name),
            ) from exc
        log.info(
            "model_written", model=entry.name, revision=stored.revision, by=by, deleted=deleted
        )
        written = revision_of(stored)
        pending = _WRITTEN.get(None)
        if pending is None:
            self.forget_wants()
        else:
            pending.append(written)  # the kept wants stay true until it commits
        return written

    @contextmanager
    def deferred(self) -> Iterator[list[Revision]]:
        """A block whose writes (one transaction's) leave the kept wants as they are: the
        revisions written are listed, for `committed` once the transaction committed (the
        wants then need no store read); if it rolls back nothing changed."""
        written: list[Revision] = []
        token = _WRITTEN.set(written)
        try:
            yield written
        finally:
            _WRITTEN.reset(token)

    def committed(self, revisions: Sequence[Revision]) -> None:
        """`revisions` (written in a `deferred` block) are committed: the kept wants take them
        in (a model's later revision is never replaced by an earlier one, whichever commit is
        told first), and wants being read meanwhile are not kept."""
        if not revisions:
            return
        with self._lock:
            self._generation += 1
            if self._wants is None:
                return
            newer = {}
            for rev in revisions:
                if rev.revision > self._kept_revisions.get(rev.name, 0):
                    newer[rev.name] = rev
                    self._kept_revisions[rev.name] = rev.revision
            if newer:
                live = [rev for rev in newer.values() if not rev.deleted]
                kept = [w for w in self._wants if w.model not in newer] + wants_of(live)
                self._wants = sorted(kept, key=lambda w: w.model)  # by name, as all() lists
        for rev in newer.values():
            self._remember((rev.name, rev.revision), rev.model)

    def _etag_now(self, name: str) -> str:
        """The model's etag now ("" when absent)."""
        found = self.find(name)
        return "" if found is None else found.etag

    def declare(self, entries: Sequence[Entry], path: str) -> None:
        """Load the models the settings file declares: written as a new revision when they
        differ from what is stored, and read-only through the API from now on (the entries
        were checked when the file was read)."""
        for entry in entries:
            current = self.find(entry.name)
            if current is None or current.entry != entry or current.declared_in != path:
                self.write(
                    entry, f"settings:{path}", self.last_revision(entry.name), declared_in=path
                )
            self.declared[entry.name] = path

    def forget_wants(self) -> None:
        """Read the wants from the store again at the next ask (the catalog changed, here or
        by another fleet: this one was following while it led)."""
        with self._lock:
            self._generation += 1
            self._wants = None

    def kept_wants(self) -> list[ProfileWant] | None:
        """The wants when they are kept (no store call needed), else None."""
        with self._lock:
            kept = self._wants
        return None if kept is None else list(kept)

    def wants(self) -> list[ProfileWant]:
        """Every profile's wanted replicas, for the controller (kept until the catalog changes:
        the controller asks every tick). A store call when they were forgotten: the
        controller asks from its own thread on PostgreSQL.

        Wants read while the catalog changed (forget_wants ran meanwhile) are answered but
        not kept, so the next ask reads the change. The current revisions' models are kept for
        `model_at` too: the endpoints of a new revision's replicas are then made without a
        store call."""
        with self._lock:
            kept, generation = self._wants, self._generation
        if kept is not None:
            return list(kept)
        current = self.all()
        wants = wants_of(current)
        for rev in current:
            self._remember((rev.name, rev.revision), rev.model)
        with self._lock:
            if generation == self._generation:
                self._wants = wants
                self._kept_revisions = {rev.name: rev.revision for rev in current}
        return list(wants)
