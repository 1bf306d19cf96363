"""The store's interface and the records it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRecord:
    """One revision of a catalog model.

    `spec` is the model as JSON-able data (the `llmgw.common.v1.Model` message in its JSON
    form, field names as in the proto). `revision` counts from 1 per model; a deletion is a
    revision too (`deleted`). `updated_at` is seconds since the epoch.
    """

    name: str
    revision: int
    spec: dict[str, Any]
    updated_by: str
    updated_at: float
    deleted: bool = False
    declared_in: str = ""


@dataclass(frozen=True)
class ReplicaRecord:
    """A replica the fleet accepted to run (desired state), with what it last observed.

    `spec` holds what the agent is told (engine, args, source, gpus …) as JSON-able data;
    `phase`/`reason`/`address`/`restarts` are the last observation, kept so a restarted fleet
    can answer before the agents reconnect.
    """

    id: str
    model: str
    profile: str
    revision: int
    node: str = ""
    gpus: tuple[int, ...] = ()
    phase: str = "PENDING"
    reason: str = ""
    address: str = ""
    restarts: int = 0
    since: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    members: tuple[dict[str, Any], ...] = ()
    """A gang's members by rank (`rank`, `node`, `gpus`, `phase`, `gang_address`); empty for
    a replica on one node."""
    progress: dict[str, Any] = field(default_factory=dict)
    """A starting replica's last reported progress (`stage`, `done_bytes`, `total_bytes`,
    `rate_bytes_per_s`, `files_done`, `files_total`, `file`); empty when there is none."""


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout's whole state as JSON-able data, and when it started and last changed."""

    id: str
    model: str
    state: str
    spec: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class RolloutRequest:
    """A control of a rollout the API side recorded for the controller to carry out (today:
    cancel it), in the same transaction as the request id's answer: `id` is the request's own,
    `reason` what the rollout's end will say, `created_at` seconds since the epoch."""

    id: str
    rollout_id: str
    kind: str
    reason: str
    by: str
    created_at: float


@dataclass(frozen=True)
class AnswerRecord:
    """The first answer to a request id: the method it was sent to, the fingerprint of the
    request (a hash of the request without its id), the serialized answer, and when it was
    stored (seconds since the epoch)."""

    method: str
    answer: bytes
    fingerprint: str = ""
    created_at: float = 0.0


@dataclass(frozen=True)
class EventRecord:
    """One event of a rollout: its place in the sequence, when, and what (JSON-able)."""

    rollout_id: str
    seq: int
    at: float
    event: dict[str, Any]


@dataclass(frozen=True)
class TrafficRecord:
    """What one gateway instance saw of one endpoint over one interval (ReportTraffic):
    `interval_start_ms` on the gateway's clock (milliseconds since the epoch); `figures` the
    counts and latency histograms as JSON-able data (`store/canary_rows.py` reads them)."""

    gateway: str
    interval_start_ms: int
    replica_id: str
    model: str
    revision: int
    interval_s: int
    figures: dict[str, Any]
    received_at: float = 0.0


@dataclass(frozen=True)
class NodeReport:
    """What the fleet holding a node's agent stream last heard of that node, for the leader's
    controller when the stream is held by another fleet (fleet_svc/nodelink/remote.py).

    `holder` names the fleet process holding the stream and `stream` that one connection (a
    new one is a new hello); `heard_at` (seconds since the epoch) is when the agent was last
    heard, refreshed at least every heartbeat interval while the stream lasts, so a row that
    stops moving is a node gone silent (its holder died). `report` is JSON-able: the node's
    Hello view, its latest report of each replica and its last acknowledgement. `seq` grows
    with every write, across every fleet, in commit order: a reader asks for rows after the
    last seq it saw."""

    node: str
    holder: str
    stream: str
    connected: bool
    heard_at: float
    report: dict[str, Any]
    seq: int = 0


DESIRED = "desired"
"""What a store's notification of desired sets written (and nothing else) says (PostgreSQL's
NOTIFY payload): a follower then forwards them and need not read the replicas again."""

BEATS_KEPT_S = 3600.0
"""How long a holder's last beat is kept: a fleet that stopped leaves its row, and a beat
this old is of no fleet serving agents now."""


@dataclass(frozen=True)
class NodeBeat:
    """When a fleet holding agents' streams last heard each of their agents: `heard` maps each
    node whose stream `holder` holds to its `heard_at` (seconds since the epoch). The holder
    writes one every heartbeat interval, in place of every node's row again: a node's row
    changes only with its report (NodeReport), and a heard_at that stops moving in its
    holder's beats is a node gone silent. `at` is when it was written; `seq` grows with every
    beat written, across every fleet, in commit order, as node reports' seqs do."""

    holder: str
    heard: dict[str, float]
    at: float
    seq: int = 0


@dataclass(frozen=True)
class DesiredRecord:
    """A node's desired set as the leader's controller made it, for the fleet holding that
    node's stream: its version and the message to send as is (`body`, serialized). `seq` grows
    with every write, in commit order (only the leader writes these, fenced)."""

    node: str
    version: int
    body: bytes
    seq: int = 0


class StaleRevision(Exception):
    """A write expected a revision that is no longer the model's latest."""

    def __init__(self, name: str, expected: int, current: int) -> None:
        super().__init__(f"{name} is at revision {current}, not {expected}")
        self.name = name
        self.expected = expected
        self.current = current


class ChecksFailed(Exception):
    """A check a block put off to its commit (Store.atomic's `checked_at_commit`) did not
    hold there: nothing of the block was kept. Its caller runs it again with every check
    made at once, which says which (StaleRevision, a request id taken, NotLeader)."""


class StoreError(Exception):
    """The store cannot do what was asked: unreachable, damaged, or of a newer schema.

    `where` names the store as people may read it (a file path, or a DSN without its password);
    `problem` says what is wrong. The message is one line: "the fleet store WHERE: PROBLEM".
    """

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"the fleet store {where}: {problem}")
        self.where = where
        self.problem = problem


class StoreUnavailable(StoreError):
    """The store cannot be reached or used now (a server down, a connection cut, a disk full);
    the same call may succeed later."""


class StoreDamaged(StoreError):
    """The store holds something the fleet cannot read: a damaged file, or a row that does not
    decode. `table` and `key` name the row when one is to blame ("" when the damage is not one
    row's)."""

    def __init__(self, where: str, problem: str, *, table: str = "", key: str = "") -> None:
        if table:
            problem = f"{table} row {key!r} cannot be read: {problem}"
        super().__init__(where, problem)
        self.table = table
        self.key = key


class NotLeader(StoreError):
    """A write fenced with a leadership epoch that is no longer the lease's: another fleet
    took the lease over (this one paused, or lost the database, past its lease). The write was
    not made. `leader_address` is where the current leader answers ("" when none holds it)."""

    def __init__(
        self, where: str, epoch: int, *, leader_epoch: int, leader: str, leader_address: str
    ) -> None:
        held = f"epoch {leader_epoch} is held by {leader} at {leader_address or '?'}"
        super().__init__(
            where, f"this fleet's leadership (epoch {epoch}) is over: {held}; it wrote nothing"
        )
        self.epoch = epoch
        self.leader_epoch = leader_epoch
        self.leader = leader
        self.leader_address = leader_address


class Store(Protocol):
    """What the fleet persists. Every write is durable when the call returns.

    A store that cannot be reached or read raises StoreUnavailable or StoreDamaged from any
    call (never its driver's own exceptions), so the fleet can tell a store problem from a bug.
    """

    thread_safe: bool
    """Whether its methods may be called from any thread (else only from the opener's)."""
    where: str
    """The store as messages name it: a file path, or a DSN without its password."""

    def close(self) -> None:
        """Release the database."""

    def probe(self) -> None:
        """Check, cheaply, that the store can be used now (reached, its schema known, no damage
        seen since it opened); the health check calls it every second or so.

        Raises:
            StoreUnavailable: it cannot be reached now.
            StoreDamaged: damage was found (at open or by a later call).
            SchemaTooNew: a newer fleet migrated it since it opened.
        """

    def verify(self) -> None:
        """Read every row and check each decodes (and the database's own integrity check, where
        it has one); called once when the store opens, before the fleet serves from it.

        Raises:
            StoreDamaged: naming the first row (table and key) or the damage found.
            StoreUnavailable: it cannot be reached.
        """

    # The catalog: every change is a new revision row; the latest non-deleted one is current.
    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""

    def model_to_change(
        self, name: str, states: Sequence[str]
    ) -> tuple[ModelRecord | None, list[RolloutRecord]]:
        """What a change of a model reads first, at once: its latest revision (None when
        absent or deleted) and its rollouts in `states`, newest first (get_model and
        list_rollouts in one call; one round trip on PostgreSQL)."""

    def list_models(self) -> list[ModelRecord]:
        """Every current model, by name."""

    def put_model(self, record: ModelRecord, *, expect_revision: int) -> ModelRecord:
        """Write `record` as revision `expect_revision + 1` (0 when the model must not exist
        or was deleted), atomically.

        Raises:
            StaleRevision: the model's latest revision is not `expect_revision`.
        """

    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""

    def atomic(self, *, checked_at_commit: bool = False) -> AbstractContextManager[None]:
        """Make every write in the block one transaction: all of them are kept, or (the block
        raised) none. Blocks nest (an inner one is a savepoint). The block must not wait on
        anything else: it holds the store's write lock (SQLite) or one pooled connection
        (PostgreSQL, for the calling thread) until it ends.

        With `checked_at_commit` a store whose every check costs a round trip (PostgreSQL)
        may put off the checks of the block's conditional writes (the fence, a request id's
        claim, a revision's compare-and-swap) to its commit, answering each as though it
        held, and send the block in one round trip. When one did not hold, nothing of the
        block is kept and it raises ChecksFailed: run it again without `checked_at_commit`,
        where each check is answered as it is made. A store that checks at once (SQLite)
        ignores it."""

    # Idempotency: the first answer to a request id.
    def get_answer(self, request_id: str) -> AnswerRecord | None:
        """The answer stored for a request id."""

    def claim_answer(self, request_id: str, method: str, fingerprint: str) -> bool:
        """Reserve a request id for an answer made in the same `atomic` block (put_answer fills
        it): True when this call reserved it, False when the id is taken (another attempt
        answered it first; a racing one is waited for until it commits)."""

    def put_answer(
        self, request_id: str, method: str, answer: bytes, *, fingerprint: str = ""
    ) -> None:
        """Keep the answer to a request id: fills the id's claimed row, or else is ignored
        when the id already has an answer (the first one written wins)."""

    def prune_answers(self, before: float) -> int:
        """Forget answers stored before `before` (seconds since the epoch); how many."""

    def forget_answer(self, request_id: str) -> None:
        """Forget one request id's answer (it no longer holds: its model was deleted since),
        so the id can be claimed again in the same `atomic` block."""

    # Replicas the fleet accepted.
    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record."""

    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert or replace a replica record."""

    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (it is stopped and gone)."""

    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        """Insert or replace `puts` and forget `deletes`, all in one transaction."""

    # Rollouts and their events.
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert or replace a rollout."""

    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""

    def list_rollouts(self, model: str = "", *, states: Sequence[str] = ()) -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first; only those in `states`
        when given."""

    def append_event(self, rollout_id: str, at: float, event: dict[str, Any]) -> int:
        """Append an event to a rollout; returns its seq (1, 2, 3 … per rollout)."""

    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order."""

    # Controls of rollouts the controller has not carried out yet.
    def put_rollout_request(self, request: RolloutRequest) -> None:
        """Record a request (a repeated id is ignored)."""

    def list_rollout_requests(self) -> list[RolloutRequest]:
        """Every request not yet carried out, oldest first."""

    def delete_rollout_requests(self, ids: Sequence[str]) -> None:
        """Forget requests the controller carried out."""

    # What the gateways report of their traffic (canary analysis).
    def put_traffic(self, records: Sequence[TrafficRecord], *, prune_before_ms: int) -> bool:
        """Keep one gateway's report of one interval (every record shares `gateway` and
        `interval_start_ms`), once: False, writing nothing, when that (gateway, interval) was
        kept before. Reports whose interval began before `prune_before_ms` are forgotten."""

    def list_traffic(self, model: str, since_ms: int) -> list[TrafficRecord]:
        """The model's traffic records of intervals that began at or after `since_ms`."""

    # Agents' streams held by any fleet: their reports in, their desired sets out.
    def put_node_reports(self, reports: Sequence[NodeReport], beat: NodeBeat | None = None) -> None:
        """Insert or replace the reports of nodes (by node), each given the next seq, and the
        holder's beat (by holder; beats written before BEATS_KEPT_S ago are dropped), in one
        transaction. Not fenced: any fleet holding a node's stream writes its node's row."""

    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        """Node reports written after `after_seq`, by seq."""

    def list_node_beats(self, after_seq: int = 0) -> list[NodeBeat]:
        """Holders' beats written after `after_seq`, by seq."""

    def put_desired(self, records: Sequence[DesiredRecord]) -> None:
        """Insert or replace nodes' desired sets (by node), each given the next seq, in one
        transaction (fenced like the controller's other writes)."""

    def list_desired(self, after_seq: int = 0) -> list[DesiredRecord]:
        """Desired sets written after `after_seq`, by seq."""

    # Small named values (counters, the last desired version per node …).
    def get_value(self, key: str) -> str | None:
        """A stored value."""

    def put_value(self, key: str, value: str) -> None:
        """Store a value."""
