"""The PostgreSQL store's batched statements: a transaction's BEGIN, its fence's read and the
writes whose answers nothing reads wait to go with the next statement that is read, all in
one round trip.

To a server on this machine a round trip is not the wire but two wake-ups (the server's
process and the calling thread), each a wait for a core on a busy machine, plus psycopg's
Python per statement. psycopg's pipeline mode saves the round trips but costs more Python
than they do there (postgres.on_this_machine), so here the statements waiting are sent as one
query of several statements in PostgreSQL's simple protocol, their values bound by psycopg
(its ClientCursor, https://www.psycopg.org/psycopg3/docs/advanced/cursors.html#client-side-binding-cursors),
and their results read one after the other (Cursor.nextset). The order of the statements, and
so every lock they take, is the order they were made in: only their sending is put off.

A deferring batch goes further: its writes, and checks the server makes (CHECKED: a statement
that raises when what it checks does not hold), all wait for the COMMIT, so a transaction that
reads nothing is one round trip, and one whose check fails is rolled back before its COMMIT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.abc import Params, QueryNoTemplate

Row = tuple[Any, ...]


class Later:
    """The rows of a statement queued to go with a later one: None until it has been sent."""

    rows: list[Row] | None = None

    def fetchone(self) -> Row | None:
        """The first row (None when it returned none, or has not been sent)."""
        return self.rows[0] if self.rows else None


class BatchingConnection(psycopg.Connection[Row]):
    """A psycopg connection (autocommit) that can hold statements back: `queue` them, and they
    go before the next statement run (`execute`, a cursor's, a transaction's) in the same
    round trip; `batch` opens a transaction that way and commits it with the writes queued.

    Outside `batch` and with nothing queued it is psycopg's own connection, statement for
    statement (server-side binding, prepared after psycopg's threshold).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._queued: list[tuple[QueryNoTemplate, Params | None, Later | None]] = []
        self._opening = False
        """A `batch` whose BEGIN is still queued: nothing of it has reached the server."""
        self._batching = False
        """Inside `batch`."""
        self._deferring = False
        """Inside a `batch(deferring=True)`: every write waits for the COMMIT."""
        self._holding = False
        """A write is queued in the `batch` (it has something to commit)."""

    @property
    def opening(self) -> bool:
        """Whether a `batch` has sent nothing yet (its BEGIN is queued)."""
        return self._opening

    def queue(
        self, query: QueryNoTemplate, params: Params | None = None, later: Later | None = None
    ) -> None:
        """Hold a statement back until the next one is run; its rows go to `later` then."""
        self._queued.append((query, params, later))

    @property
    def deferring(self) -> bool:
        """Whether a `batch(deferring=True)` is open: its writes and checks go with its
        COMMIT (`check_later`)."""
        return self._deferring

    def write_later(self, query: QueryNoTemplate, params: Params | None = None) -> None:
        """A write whose answer nothing reads: inside a `batch` that has sent its first
        statement (and with it the fence, read before the COMMIT) or that defers, queued to go
        with the next statement or the COMMIT; else run now."""
        if self._batching and (self._deferring or not self._opening):
            self._holding = True
            self.queue(query, params)
        else:
            self.execute(query, params)

    def check_later(self, query: QueryNoTemplate, params: Params | None = None) -> None:
        """Inside a `batch(deferring=True)`: a statement (a write or a read) that raises on
        the server when what it checks does not hold (CHECKED's form), queued like a write:
        the COMMIT after it then never runs, and the block raises the server's error."""
        if not self._deferring:
            raise psycopg.ProgrammingError("check_later outside a deferring batch")
        self._holding = True
        self.queue(query, params)

    def flush(self) -> None:
        """Send what is queued now (one round trip; nothing when nothing is)."""
        if self._queued:
            self._send(self._queued)

    # psycopg's own also takes a t-string Template (Python 3.14); the store sends none.
    def execute(  # type: ignore[override]
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> psycopg.Cursor[Row]:
        """psycopg's execute; with statements queued, sent after them in one round trip."""
        if not self._queued:
            return super().execute(query, params, prepare=prepare, binary=binary)
        return self._send([*self._queued, (query, params, None)])

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """psycopg's cursor, once what is queued has been sent (its statements go after)."""
        self.flush()
        return super().cursor(*args, **kwargs)

    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        """psycopg's transaction (a savepoint inside a `batch`), once what is queued is sent."""
        self.flush()
        return super().transaction(*args, **kwargs)

    def pipeline(self) -> Any:
        """psycopg's pipeline, once what is queued is sent."""
        self.flush()
        return super().pipeline()

    @contextmanager
    def batch(self, *, deferring: bool = False) -> Iterator[None]:
        """One transaction whose BEGIN goes with its first statement and whose COMMIT with the
        writes still queued at its end; rolled back when the block raises (no round trip when
        nothing of it was sent, and nothing when it wrote nothing).

        `deferring`: every write waits for the COMMIT, even before anything was sent, and so
        do the checks of `check_later`: a block that reads nothing is one round trip."""
        if self._queued or self._opening or self.pgconn.transaction_status != _IDLE:
            raise psycopg.ProgrammingError("a batch is already open on this connection")
        self.queue("BEGIN")
        self._opening = self._batching = True
        self._deferring, self._holding = deferring, False
        try:
            yield
            if self._opening and not self._holding:
                self._queued, self._opening = [], False  # nothing was sent: nothing to commit
                return
            self.queue("COMMIT")
            self.flush()
        except BaseException:
            self._abandon()
            raise
        finally:
            self._batching = self._deferring = self._holding = False

    def _abandon(self) -> None:
        """Forget what is queued and roll back what was sent (a broken connection is left to
        the pool, which discards it)."""
        self._queued, self._opening = [], False
        if self.broken or self.closed or self.pgconn.transaction_status == _IDLE:
            return
        with contextlib.suppress(psycopg.Error):
            self.rollback()

    def _send(
        self, items: list[tuple[QueryNoTemplate, Params | None, Later | None]]
    ) -> psycopg.Cursor[Row]:
        """`items` as one query; the cursor on the last one's result, each `Later` filled."""
        self._queued, self._opening = [], False
        cur = psycopg.ClientCursor(self)
        cur.execute("; ".join(cur.mogrify(query, params) for query, params, _ in items))
        for i, (_, _, later) in enumerate(items):
            if i:
                cur.nextset()
            if later is not None:
                later.rows = cur.fetchall() if cur.description is not None else []
        return cur


_IDLE = psycopg.pq.TransactionStatus.IDLE

CHECKED = "WITH checked AS ({}) SELECT 1 / count(*) FROM checked"
"""A check the server makes (`check_later`): the statement inside (a SELECT, or an INSERT …
RETURNING: a write must be a WITH query of its own) returns one row when what it checks holds
and none when not, and then the division raises division_by_zero (SQLSTATE 22012), which no
other statement of the store can raise. `count(*)` is not a constant, so the division
is made when the statement runs, not when it is planned (a constant `1 / 0` would fail every
time: https://www.postgresql.org/docs/15/sql-expressions.html#SYNTAX-EXPRESS-EVAL)."""


def check_failed(exc: BaseException) -> bool:
    """Whether `exc` is a CHECKED statement's refusal (its check did not hold)."""
    return isinstance(exc, psycopg.errors.DivisionByZero)
