"""The PostgreSQL store's answers to request ids: the first answer to each is kept, so a
retried request is answered as the first attempt was."""

from __future__ import annotations

from fleet_svc.store.base import AnswerRecord
from fleet_svc.store.postgres_batch import CHECKED
from fleet_svc.store.postgres_calls import PostgresCalls, guarded, once

_CLAIM = (
    "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
    " VALUES (%s, %s, '', %s, %s) ON CONFLICT (request_id) DO NOTHING RETURNING 1"
)
"""A request id's claim: one row when this call reserved it, none when it was taken."""


class AnswerCalls(PostgresCalls):
    """The Store's calls on answers (base.Store, idempotency)."""

    @guarded
    def get_answer(self, request_id: str) -> AnswerRecord | None:
        """The answer stored for a request id, None when there is none."""
        with self.link.connection() as conn:
            row = conn.execute(
                "SELECT method, answer, fingerprint, created_at FROM answers WHERE request_id = %s",
                (request_id,),
            ).fetchone()
        if row is None:
            return None
        return AnswerRecord(str(row[0]), bytes(row[1]), str(row[2]), float(row[3]))

    @once
    def claim_answer(self, request_id: str, method: str, fingerprint: str) -> bool:
        """Reserve a request id (an empty answer until put_answer fills it); False when taken.
        A racing attempt's uncommitted claim makes this insert wait for it (the primary key),
        then find the id taken. In a block checked at its commit, True: the claim is checked
        there (ChecksFailed when the id was taken)."""
        params = (request_id, method, self._clock(), fingerprint)
        with self.link.connection() as conn, self._writing(conn):
            if conn.deferring:
                conn.check_later(CHECKED.format(_CLAIM), params)
                return True
            return conn.execute(_CLAIM, params).fetchone() is not None

    @guarded
    def put_answer(
        self, request_id: str, method: str, answer: bytes, *, fingerprint: str = ""
    ) -> None:
        """Keep the answer to a request id: fill its claimed (empty) row of the same method and
        fingerprint; any other answer already there is kept."""
        with self.link.connection() as conn, self._writing(conn):
            # Nothing reads its answer: inside a change's transaction it goes with the COMMIT.
            conn.write_later(
                "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (request_id) DO UPDATE"
                " SET answer = excluded.answer WHERE length(answers.answer) = 0"
                " AND answers.method = excluded.method"
                " AND answers.fingerprint = excluded.fingerprint",
                (request_id, method, answer, self._clock(), fingerprint),
            )

    @guarded
    def prune_answers(self, before: float) -> int:
        """Forget answers stored before `before`; how many were."""
        with self.link.connection() as conn, self._writing(conn):
            # Counted by the server: a pipelined statement's rowcount is not known until read.
            row = conn.execute(
                "WITH gone AS (DELETE FROM answers WHERE created_at < %s RETURNING 1)"
                " SELECT count(*) FROM gone",
                (before,),
            ).fetchone()
            return 0 if row is None else int(row[0])

    @guarded
    def forget_answer(self, request_id: str) -> None:
        """Forget one request id's answer."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute("DELETE FROM answers WHERE request_id = %s", (request_id,))
