"""The SQLite store's answers to request ids: the first answer to each is kept, so a retried
request is answered as the first attempt was."""

from __future__ import annotations

from fleet_svc.store.base import AnswerRecord
from fleet_svc.store.sqlite_calls import SQLiteCalls, guarded


class AnswerCalls(SQLiteCalls):
    """The Store's calls on answers (base.Store, idempotency)."""

    @guarded
    def get_answer(self, request_id: str) -> AnswerRecord | None:
        """The answer stored for a request id, None when there is none."""
        row = self._conn.execute(
            "SELECT method, answer, fingerprint, created_at FROM answers WHERE request_id = ?",
            (request_id,),
        ).fetchone()
        if row is None:
            return None
        return AnswerRecord(str(row[0]), bytes(row[1]), str(row[2]), float(row[3]))

    @guarded
    def claim_answer(self, request_id: str, method: str, fingerprint: str) -> bool:
        """Reserve a request id (an empty answer until put_answer fills it); False when taken."""
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO answers (request_id, method, answer, created_at, fingerprint)"
            " VALUES (?, ?, X'', ?, ?)",
            (request_id, method, self._clock(), fingerprint),
        )
        return cur.rowcount == 1

    @guarded
    def put_answer(
        self, request_id: str, method: str, answer: bytes, *, fingerprint: str = ""
    ) -> None:
        """Keep the answer to a request id: fill its claimed (empty) row of the same method and
        fingerprint; any other answer already there is kept."""
        # DO NOTHING unless claimed: a retry racing the first attempt must not replace the
        # answer already given.
        self._conn.execute(
            "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE"
            " SET answer = excluded.answer WHERE length(answers.answer) = 0"
            " AND answers.method = excluded.method AND answers.fingerprint = excluded.fingerprint",
            (request_id, method, answer, self._clock(), fingerprint),
        )

    @guarded
    def prune_answers(self, before: float) -> int:
        """Forget answers stored before `before`; how many were."""
        cur = self._conn.execute("DELETE FROM answers WHERE created_at < ?", (before,))
        return cur.rowcount

    @guarded
    def forget_answer(self, request_id: str) -> None:
        """Forget one request id's answer."""
        self._conn.execute("DELETE FROM answers WHERE request_id = ?", (request_id,))
