"""The PostgreSQL store's rows of agents' streams: node reports any fleet writes, desired sets
the leader writes; each row given the next seq so a reader asks only for what is newer.

Node reports come from several fleets at once, so their seqs are taken holding
NODE_REPORTS_LOCK until commit: a seq is never committed after a higher one, and a reader that
saw seq N has seen every row at or below it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from fleet_svc.store.base import BEATS_KEPT_S, DesiredRecord, NodeBeat, NodeReport
from fleet_svc.store.codec import dump_json, loaded_heard, loaded_object

NODE_REPORTS_LOCK = 0x6C6C6D67_77000002
"""The advisory lock a write of node reports holds until it commits (see the docstring)."""

Conn = psycopg.Connection[tuple[Any, ...]]


def _next_seq(conn: Conn, table: str) -> int:
    row = conn.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {table}").fetchone()
    return (0 if row is None else int(row[0])) + 1


def put_reports(conn: Conn, reports: Sequence[NodeReport], beat: NodeBeat | None = None) -> None:
    """Upsert `reports`, each at the next seq, then `beat` (pruning beats older than
    BEATS_KEPT_S), in the caller's transaction."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (NODE_REPORTS_LOCK,))
    if reports:
        _put_reports(conn, reports)
    if beat is not None:
        conn.execute(
            "INSERT INTO node_beats (holder, heard, at, seq) VALUES (%s, %s::json, %s, %s)"
            " ON CONFLICT (holder) DO UPDATE SET heard = excluded.heard, at = excluded.at,"
            " seq = excluded.seq",
            (beat.holder, dump_json(beat.heard), beat.at, _next_seq(conn, "node_beats")),
        )
        conn.execute("DELETE FROM node_beats WHERE at < %s", (beat.at - BEATS_KEPT_S,))


def list_beats(conn: Conn, after_seq: int) -> list[NodeBeat]:
    """Beats after `after_seq`, by seq."""
    rows = conn.execute(
        "SELECT holder, heard::text, at, seq FROM node_beats WHERE seq > %s ORDER BY seq",
        (after_seq,),
    ).fetchall()
    return [NodeBeat(str(r[0]), loaded_heard(str(r[1])), float(r[2]), int(r[3])) for r in rows]


def _put_reports(conn: Conn, reports: Sequence[NodeReport]) -> None:
    first = _next_seq(conn, "node_reports")
    rows = [
        (r.node, r.holder, r.stream, r.connected, r.heard_at, dump_json(r.report), first + i)
        for i, r in enumerate(reports)
    ]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO node_reports (node, holder, stream, connected, heard_at, report, seq)"
            " VALUES (%s, %s, %s, %s, %s, %s::json, %s) ON CONFLICT (node) DO UPDATE SET"
            " holder = excluded.holder, stream = excluded.stream,"
            " connected = excluded.connected, heard_at = excluded.heard_at,"
            " report = excluded.report, seq = excluded.seq",
            rows,
        )


class ReportsRead:
    """The report each node's row held when last read, as text and decoded: a holder
    refreshes every row each heartbeat interval, mostly with the same report, and a row read
    again with the same text is given the same (unchanged) decoded object, not parsed again."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[str, dict[str, Any]]] = {}

    def decoded(self, node: str, text: str) -> dict[str, Any]:
        """The report `text` of `node`'s row, decoded (the object of the last read when the
        text is the same: callers do not change it)."""
        known = self._by_node.get(node)
        if known is not None and known[0] == text:
            return known[1]
        report = loaded_object(text)
        self._by_node[node] = (text, report)
        return report


def list_reports(conn: Conn, after_seq: int, read: ReportsRead) -> list[NodeReport]:
    """Rows after `after_seq`, by seq (`read`: the reports read before)."""
    rows = conn.execute(
        "SELECT node, holder, stream, connected, heard_at, report::text, seq FROM node_reports"
        " WHERE seq > %s ORDER BY seq",
        (after_seq,),
    ).fetchall()
    return [
        NodeReport(
            node=str(r[0]),
            holder=str(r[1]),
            stream=str(r[2]),
            connected=bool(r[3]),
            heard_at=float(r[4]),
            report=read.decoded(str(r[0]), str(r[5])),
            seq=int(r[6]),
        )
        for r in rows
    ]


def put_desired(conn: Conn, records: Sequence[DesiredRecord]) -> None:
    """Upsert `records` in the caller's (fenced) transaction, each at the next seq."""
    first = _next_seq(conn, "desired_sets")
    rows = [(d.node, d.version, d.body, first + i) for i, d in enumerate(records)]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO desired_sets (node, version, body, seq) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (node) DO UPDATE SET version = excluded.version,"
            " body = excluded.body, seq = excluded.seq",
            rows,
        )


def list_desired(conn: Conn, after_seq: int) -> list[DesiredRecord]:
    """Rows after `after_seq`, by seq."""
    rows = conn.execute(
        "SELECT node, version, body, seq FROM desired_sets WHERE seq > %s ORDER BY seq",
        (after_seq,),
    ).fetchall()
    return [DesiredRecord(str(r[0]), int(r[1]), bytes(r[2]), int(r[3])) for r in rows]
