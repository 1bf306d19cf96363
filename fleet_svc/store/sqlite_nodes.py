"""The SQLite store's rows of agents' streams (as fleet_svc/store/postgres_nodes.py): each row
given the next seq inside the caller's write transaction, which SQLite's one writer lock
orders. One fleet uses a file and always leads, so these rows are written only by a fleet that
followed; they are kept so both stores answer alike."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from fleet_svc.store.base import BEATS_KEPT_S, DesiredRecord, NodeBeat, NodeReport
from fleet_svc.store.codec import dump_json, loaded_heard, loaded_object


def _next_seq(conn: sqlite3.Connection, table: str) -> int:
    row = conn.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {table}").fetchone()
    return (0 if row is None else int(row[0])) + 1


def put_reports(conn: sqlite3.Connection, reports: Sequence[NodeReport]) -> None:
    """Upsert `reports` in the caller's transaction, each at the next seq."""
    first = _next_seq(conn, "node_reports")
    rows = [
        (r.node, r.holder, r.stream, int(r.connected), r.heard_at, dump_json(r.report), first + i)
        for i, r in enumerate(reports)
    ]
    conn.executemany(
        "INSERT INTO node_reports (node, holder, stream, connected, heard_at, report, seq)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO UPDATE SET"
        " holder = excluded.holder, stream = excluded.stream, connected = excluded.connected,"
        " heard_at = excluded.heard_at, report = excluded.report, seq = excluded.seq",
        rows,
    )


def put_beat(conn: sqlite3.Connection, beat: NodeBeat) -> None:
    """Upsert `beat` at the next seq in the caller's transaction, pruning beats older than
    BEATS_KEPT_S."""
    conn.execute(
        "INSERT INTO node_beats (holder, heard, at, seq) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (holder) DO UPDATE SET heard = excluded.heard, at = excluded.at,"
        " seq = excluded.seq",
        (beat.holder, dump_json(beat.heard), beat.at, _next_seq(conn, "node_beats")),
    )
    conn.execute("DELETE FROM node_beats WHERE at < ?", (beat.at - BEATS_KEPT_S,))


def list_beats(conn: sqlite3.Connection, after_seq: int) -> list[NodeBeat]:
    """Beats after `after_seq`, by seq."""
    rows = conn.execute(
        "SELECT holder, heard, at, seq FROM node_beats WHERE seq > ? ORDER BY seq", (after_seq,)
    ).fetchall()
    return [NodeBeat(str(r[0]), loaded_heard(r[1]), float(r[2]), int(r[3])) for r in rows]


def list_reports(conn: sqlite3.Connection, after_seq: int) -> list[NodeReport]:
    """Rows after `after_seq`, by seq."""
    rows = conn.execute(
        "SELECT node, holder, stream, connected, heard_at, report, seq FROM node_reports"
        " WHERE seq > ? ORDER BY seq",
        (after_seq,),
    ).fetchall()
    return [
        NodeReport(
            node=str(r[0]),
            holder=str(r[1]),
            stream=str(r[2]),
            connected=bool(r[3]),
            heard_at=float(r[4]),
            report=loaded_object(r[5]),
            seq=int(r[6]),
        )
        for r in rows
    ]


def put_desired(conn: sqlite3.Connection, records: Sequence[DesiredRecord]) -> None:
    """Upsert `records` in the caller's transaction, each at the next seq."""
    first = _next_seq(conn, "desired_sets")
    conn.executemany(
        "INSERT INTO desired_sets (node, version, body, seq) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (node) DO UPDATE SET version = excluded.version,"
        " body = excluded.body, seq = excluded.seq",
        [(d.node, d.version, d.body, first + i) for i, d in enumerate(records)],
    )


def list_desired(conn: sqlite3.Connection, after_seq: int) -> list[DesiredRecord]:
    """Rows after `after_seq`, by seq."""
    rows = conn.execute(
        "SELECT node, version, body, seq FROM desired_sets WHERE seq > ? ORDER BY seq",
        (after_seq,),
    ).fetchall()
    return [DesiredRecord(str(r[0]), int(r[1]), bytes(r[2]), int(r[3])) for r in rows]
