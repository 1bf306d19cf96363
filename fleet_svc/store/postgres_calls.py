"""The PostgreSQL store's calls: what psycopg raises turned into store errors, retries on a
fresh connection, and the scope of each write (its transaction, its fence, its pipeline).

Every call of the store's aggregates (postgres_catalog.py, postgres_answers.py,
postgres_state.py, postgres_traffic.py, and postgres.py's own) is wrapped by one of `guarded`,
`once` or `trying`, and takes its connection and transaction from `PostgresCalls`, which
PostgresStore (postgres.py) is made of with them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
import psycopg_pool
import structlog

from fleet_svc.store.base import ChecksFailed, StoreDamaged, StoreUnavailable
from fleet_svc.store.codec import readable_rows
from fleet_svc.store.postgres_batch import CHECKED, BatchingConnection, Later, check_failed
from fleet_svc.store.postgres_lease import (
    FENCE_HELD_QUERY,
    FENCE_QUERY,
    LEASE_NAME,
    check_fence,
    fenced,
)
from fleet_svc.store.postgres_link import POOL_MAX, Link, NoConnection, first_line

log = structlog.get_logger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="PostgresCalls")


def guarded(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """Raise a store error for what psycopg raises; fail fast while the server is down; tried
    again on a fresh connection when the one it used broke under it (the method must be
    safe to run twice: a read, an upsert, an insert that ignores a repeat, a delete)."""
    return _translating(method, fail_fast=True, again=True)


def once(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """As guarded, but never run twice: a broken connection may have committed the first try
    (a catalog revision, an event), so the caller is told StoreUnavailable and decides."""
    return _translating(method, fail_fast=True, again=False)


def trying(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """As guarded, but always trying the server (the health probe: it is what notices the
    server is back)."""
    return _translating(method, fail_fast=False, again=True)


def _translating(
    method: Callable[Concatenate[S, P], R], *, fail_fast: bool, again: bool
) -> Callable[Concatenate[S, P], R]:
    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if fail_fast:
            self.link.fail_fast()
        # Every pooled connection may have been cut at once: one try more than the pool holds.
        # Never again inside an atomic block: its transaction is gone with its connection.
        tries = POOL_MAX + 1 if again and self.link.pinned() is None else 1
        for attempt in range(1, tries + 1):
            try:
                result = method(self, *args, **kwargs)
                self._settle_fence()
            except StoreDamaged as exc:
                self.damage = self.damage or exc
                raise
            except psycopg_pool.PoolClosed:
                raise  # the store was closed: the caller's mistake, as a closed SQLite store's
            except NoConnection as exc:
                # The server cannot be reached: fail fast until it can (see FAIL_FAST_S).
                raise self.link.down(exc.problem) from exc
            except psycopg.OperationalError as exc:
                # A connection broke under the call (the server ended it: a restart,
                # pg_terminate_backend, 57P01 admin_shutdown) or a statement timed out: the
                # server or the network, not the data. Once more on a fresh connection when
                # that is safe; the server itself may be fine, so no fail-fast.
                if attempt < tries:
                    log.info("store_call_retried", store=self.where, problem=first_line(exc))
                    continue
                raise StoreUnavailable(self.where, first_line(exc)) from exc
            except (psycopg.IntegrityError, psycopg.InterfaceError):
                raise  # a constraint the caller broke, or a closed store: the caller's mistake
            except psycopg.DatabaseError as exc:
                pinned = self.link.pinned()
                if pinned is not None and pinned.deferring and check_failed(exc):
                    # A check the block put off (sent before this call's statement) did not
                    # hold: the block is run again, checking at once.
                    raise ChecksFailed() from exc
                # A table or column gone, a row the server cannot return: the schema is damaged.
                damaged = StoreDamaged(self.where, f"PostgreSQL: {first_line(exc)}")
                self.damage = self.damage or damaged
                raise damaged from exc
            self.link.reached()
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    return call


class PostgresCalls:
    """What every call of the PostgreSQL store shares: its pool, where it is (for messages),
    the damage found, the fence its writes carry, and the scopes of a write and a block."""

    link: Link
    where: str
    pipelining: bool
    """Whether a write outside an atomic block sends its statements in psycopg's pipeline mode
    (to a server on another host) rather than batched (postgres_batch: on this machine, where
    the pipeline's own work costs more than the round trips it saves; see
    postgres.on_this_machine). An atomic block is batched either way."""
    damage: StoreDamaged | None
    """The first damage a call found; `probe` reports it until the store is reopened."""
    _fence: int | None
    """The leadership epoch every write is fenced with (None: writes are not fenced)."""
    _unsettled: threading.local
    """`fence`: the fence an `atomic` block of this thread sent and has not read yet."""
    _clock: Callable[[], float]
    """Seconds since the epoch, stamped on stored answers."""

    def fence(self, epoch: int | None) -> None:
        """Fence every later write with `epoch` (None: stop fencing): each is made only while
        `epoch` is the lease's, else refused with NotLeader."""
        self._fence = epoch

    @contextmanager
    def _writing(self, conn: BatchingConnection, *, transaction: bool = False) -> Iterator[None]:
        """The scope of one write: inside `atomic`, its transaction (fenced at its start, its
        share lock on the lease held until it ends: no savepoint, no second check); else a
        transaction checking the fence first when fenced (or when the write needs one anyway):
        pipelined when `pipelining` (BEGIN and the fence's read in one round trip, the writes
        and COMMIT in another), else batched (BEGIN and the fence's read sent with the first
        statement, COMMIT with the writes queued by BatchingConnection.write_later); else the
        bare autocommit statement(s)."""
        if self.link.pinned() is not None:
            yield
            return
        epoch = self._fence
        if epoch is None and not transaction:
            yield
            return
        if not self.pipelining:
            with self._batched(conn):
                yield
            return
        with self._pipelined(conn), conn.transaction():
            if epoch is not None:
                check_fence(conn, epoch, self.where)
            yield

    @contextmanager
    def _batched(self, conn: BatchingConnection, *, deferring: bool = False) -> Iterator[None]:
        """A transaction whose BEGIN and fence (when fenced) go with its first statement
        (postgres_batch), the fence read before anything is committed; `deferring`: the fence
        checked by the server, and every write sent with the COMMIT."""
        with conn.batch(deferring=deferring):
            if self._fence is not None and deferring:
                conn.check_later(CHECKED.format(FENCE_HELD_QUERY), (LEASE_NAME, self._fence))
            elif self._fence is not None:
                later = Later()
                conn.queue(FENCE_QUERY, (LEASE_NAME,), later)
                self._unsettled.fence = (later, self._fence)
            try:
                yield
                self._settle_fence()
            finally:
                self._unsettled.fence = None

    @contextmanager
    def _pipelined(self, conn: psycopg.Connection[tuple[Any, ...]]) -> Iterator[None]:
        """Statements sent together: a pipeline when `pipelining` (inside `atomic`, its
        own), else one statement at a time."""
        if not self.pipelining or self.link.pinned() is not None:
            yield
            return
        with conn.pipeline():
            yield

    @contextmanager
    def atomic(self, *, checked_at_commit: bool = False) -> Iterator[None]:
        """One transaction for the block's writes (Store.atomic), on one pooled connection
        pinned to the calling thread until it ends (every store call of that thread uses it;
        psycopg makes an inner transaction a savepoint); fenced when the store is.

        `checked_at_commit`: the fence, a request id's claim and a revision's compare-and-swap
        are checks the server makes (postgres_batch.CHECKED), sent with the COMMIT and every
        write, so a block that reads nothing is one round trip; ChecksFailed when one did not
        hold (nothing kept)."""
        if self.link.pinned() is not None:
            with self.link.connection() as conn, conn.transaction():
                yield
            return
        try:
            self.link.fail_fast()
            # Batched, to a server on any host: BEGIN and the fence go with the block's first
            # statement, the writes whose answers are not read with its COMMIT: the round trips
            # psycopg's pipeline would make of the block (each call in it reads its answer
            # before the next is made), for less Python.
            with (
                self.link.connection() as conn,
                self.link.pin(conn),
                self._batched(conn, deferring=checked_at_commit),
            ):
                yield
        except NoConnection as exc:
            raise self.link.down(exc.problem) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(self.where, first_line(exc)) from exc
        except (psycopg.IntegrityError, psycopg.InterfaceError):
            raise  # as `guarded`: a constraint the caller broke, or a closed store
        except psycopg.DatabaseError as exc:
            if checked_at_commit and check_failed(exc):
                raise ChecksFailed() from exc  # a check sent with the COMMIT did not hold
            # A write queued for the COMMIT failed there, outside the calls that `guarded`
            # translates: as theirs, the schema is damaged.
            damaged = StoreDamaged(self.where, f"PostgreSQL: {first_line(exc)}")
            self.damage = self.damage or damaged
            raise damaged from exc

    def _settle_fence(self) -> None:
        """Inside a fenced transaction: refuse to go on unless the fence sent at its start
        holds (read once, after the first statement whose answer was read: pipelined or
        batched, it came back with it; nothing when it has not been sent yet).

        Raises:
            NotLeader: the epoch is over; the block's transaction is rolled back.
        """
        unsettled: tuple[psycopg.Cursor[tuple[Any, ...]] | Later, int] | None = getattr(
            self._unsettled, "fence", None
        )
        if unsettled is None:
            return
        found, epoch = unsettled
        if isinstance(found, Later) and found.rows is None:
            return
        self._unsettled.fence = None
        fenced(found.fetchone(), epoch, self.where)

    def _readable(
        self, rows: Sequence[tuple[Any, ...]], decode: Callable[[str, tuple[Any, ...]], R]
    ) -> list[R]:
        """The rows that decode (codec.readable_rows); damage met is remembered."""
        out, damage = readable_rows(self.where, rows, decode)
        self.damage = self.damage or damage
        return out
