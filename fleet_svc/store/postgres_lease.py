"""Leadership among fleets sharing one PostgreSQL database: a lease row with a fencing epoch.

A fleet holds the lease while it renews it before it expires; another may take it only once it
has expired, and every change of holder adds one to the epoch. The leader fences its writes with
its epoch: each runs in a transaction that first reads the lease row `FOR SHARE` and refuses the
write (NotLeader) when the epoch is no longer its own. The share lock makes the check and the
write one step against a takeover: a taker's UPDATE of the row waits until fenced writes in
flight commit, and any write after the takeover sees the new epoch. So a leader paused past its
lease (SIGSTOP, a long GC, a partition) writes nothing once resumed: a write it had begun holds
its session idle in a transaction, which the server ends after IDLE_IN_TRANSACTION_MS (freeing
the row for the taker, and failing the write at its commit).

Lease times are the server's (clock_timestamp()), so fleets need not agree on the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from fleet_svc.store.base import NotLeader

LEASE_NAME = "fleet"
"""The one lease fleets on a database contend for."""
IDLE_IN_TRANSACTION_MS = 5_000
"""Sessions idle inside a transaction longer than this are ended by the server
(idle_in_transaction_session_timeout): a paused leader cannot hold the lease row's lock."""

_ACQUIRE = """
INSERT INTO leases AS l (name, holder, address, epoch, expires_at)
VALUES (%(name)s, %(holder)s, %(address)s, 1,
        clock_timestamp() + make_interval(secs => %(lease_s)s))
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    address = excluded.address,
    epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > clock_timestamp()
                 THEN l.epoch ELSE l.epoch + 1 END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp()
RETURNING l.epoch
"""


@dataclass(frozen=True)
class Lease:
    """Who holds the lease, at which epoch, and whether that is the fleet that asked."""

    holder: str
    address: str
    epoch: int
    mine: bool


def acquire(
    conn: psycopg.Connection[tuple[Any, ...]],
    holder: str,
    address: str,
    lease_s: float,
) -> Lease:
    """Take or renew the lease for `lease_s` seconds from now, when it is free, expired or
    already `holder`'s; else say who holds it.

    A holder renewing in time keeps its epoch; one renewing after its lease ran out gets a new
    epoch even if nobody took it meanwhile (its old epoch's writes stay refused).
    """
    row = conn.execute(
        _ACQUIRE,
        {"name": LEASE_NAME, "holder": holder, "address": address, "lease_s": lease_s},
    ).fetchone()
    if row is not None:
        return Lease(holder, address, int(row[0]), True)
    current = conn.execute(
        "SELECT holder, address, epoch FROM leases WHERE name = %s", (LEASE_NAME,)
    ).fetchone()
    if current is None:  # released and deleted between the two statements: ask again
        return acquire(conn, holder, address, lease_s)
    return Lease(str(current[0]), str(current[1]), int(current[2]), False)


def release(conn: psycopg.Connection[tuple[Any, ...]], holder: str) -> None:
    """End `holder`'s lease now (a fleet stopping cleanly), so another need not wait it out."""
    conn.execute(
        "UPDATE leases SET expires_at = clock_timestamp() WHERE name = %s AND holder = %s",
        (LEASE_NAME, holder),
    )


FENCE_QUERY = "SELECT holder, address, epoch FROM leases WHERE name = %s FOR SHARE"
"""The lease row, share-locked until the transaction ends (see check_fence)."""
FENCE_HELD_QUERY = "SELECT epoch FROM leases WHERE name = %s AND epoch = %s FOR SHARE"
"""The lease row when it holds the epoch given, share-locked until the transaction ends: no
row when another epoch holds it (the fence as a check the server makes, postgres_batch.CHECKED)."""


def check_fence(conn: psycopg.Connection[tuple[Any, ...]], epoch: int, where: str) -> None:
    """Inside a transaction: refuse to go on unless `epoch` is the lease's epoch, holding the
    lease row's share lock until the transaction ends.

    Raises:
        NotLeader: the epoch is over.
    """
    fenced(conn.execute(FENCE_QUERY, (LEASE_NAME,)).fetchone(), epoch, where)


def fenced(row: tuple[Any, ...] | None, epoch: int, where: str) -> None:
    """Refuse unless `row` (FENCE_QUERY's answer) holds `epoch`.

    Raises:
        NotLeader: the epoch is over.
    """
    if row is None or int(row[2]) != epoch:
        raise NotLeader(
            where,
            epoch,
            leader_epoch=0 if row is None else int(row[2]),
            leader="nobody" if row is None else str(row[0]),
            leader_address="" if row is None else str(row[1]),
        )
