"""The controller driven tick by tick on a fake clock, with a real store and a fake agent
link: placement and desired sets, drains, resends and node liveness, without sleeps."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_svc.controller import Controller
from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.nodes import Liveness, NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import ReplicaState, RunSpec, StartProgress
from fleet_svc.domain.reports import Observed
from fleet_svc.nodelink.desired import RESEND_S, VERSION_BLOCK, VERSION_KEY
from fleet_svc.store.rows import progress_doc
from fleet_svc.store.sqlite import SQLiteStore
from fleet_svc.store_calls import inline
from llmgw.card import Card
from llmgw.testing.clock import FakeClock

P = ReplicaPhase
LIVENESS = Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=10.0)
DRAIN_S = 2.0
WANT = ProfileWant(
    "m", "gpu", revision=1, replicas=1, want=Want("L4", 1), spec=RunSpec("vllm", ("-x",))
)


class Link:
    """A fake agent stream: records the desired sets the controller sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[str]]] = []
        self.closed = ""

    def send_desired(
        self, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
    ) -> None:
        self.sent.append((version, [r.id for r in replicas]))

    def close(self, reason: str) -> None:
        self.closed = reason


class Fleet:
    """A controller over a store in a temp folder, a fake clock and a mutable catalog."""

    def __init__(self, path: Path, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.store = SQLiteStore(path / "fleet.db")
        self.wants: list[ProfileWant] = [WANT]
        counter = itertools.count(1)
        self.controller = Controller(
            self.store,
            lambda: list(self.wants),
            clock=self.clock,
            liveness=LIVENESS,
            drain_s=DRAIN_S,
            new_id=lambda: f"r{next(counter)}",
        )

    def connect(self, name: str = "n1", link: Link | None = None) -> Link:
        """An agent with one L4 card says hello, running nothing."""
        link = link or Link()
        view = NodeView(name=name, cards=(Card(0, model="L4"),), memory_bytes=1 << 34)
        self.controller.agent_connected(view, [], link)
        return link

    def node_phase(self, name: str = "n1") -> NodePhase:
        """A node's phase as of the last tick."""
        return self.controller.state.nodes[name].phase

    def replica(self) -> ReplicaState:
        """The one replica the fleet keeps."""
        (r,) = self.controller.state.replicas.values()
        return r


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A controller wanting one replica of m/gpu, no agent connected yet."""
    f = Fleet(tmp_path)
    yield f
    f.store.close()


def test_a_wanted_replica_is_placed_and_its_node_told(fleet: Fleet) -> None:
    """One tick creates the replica, places it on the connected node's card and sends the
    node its desired set; the replica is in the store before it is sent."""
    link = fleet.connect()
    fleet.controller.tick()
    r = fleet.replica()
    assert (r.phase, r.node, r.gpus, r.spec) == (P.STARTING, "n1", (0,), WANT.spec)
    assert r.since_s == fleet.clock.wall()
    assert link.sent == [(1, [r.id])]
    assert [rec.id for rec in fleet.store.list_replicas()] == [r.id]


def test_an_unacknowledged_set_is_sent_again_with_its_version(fleet: Fleet) -> None:
    """A desired set nobody acknowledged is resent after RESEND_S with the same version; an
    acknowledged one is not; a changed one gets the next version."""
    link = fleet.connect()
    fleet.controller.tick()
    fleet.clock.advance(RESEND_S - 0.1)
    fleet.controller.tick()
    assert len(link.sent) == 1
    fleet.clock.advance(0.1)
    fleet.controller.tick()
    assert [v for v, _ in link.sent] == [1, 1]
    fleet.controller.acknowledged("n1", 1, [])
    fleet.clock.advance(RESEND_S * 3)
    fleet.controller.heartbeat("n1", [], 0)
    fleet.controller.tick()
    assert len(link.sent) == 2
    fleet.wants = []
    fleet.controller.tick()
    assert fleet.replica().phase is P.STOPPING
    assert link.sent[-1] == (2, [])  # stopping: the node is told to run it no more


def test_versions_keep_growing_across_a_restart(fleet: Fleet, tmp_path: Path) -> None:
    """A restarted controller hands out versions above every one handed out before."""
    fleet.connect()
    fleet.controller.tick()
    inline(fleet.controller.flush())
    again = Fleet(tmp_path, fleet.clock)
    link = again.connect()
    again.controller.tick()
    assert link.sent and link.sent[0][0] > 1
    again.store.close()


def test_a_drain_lasts_drain_s_on_the_monotonic_clock(fleet: Fleet) -> None:
    """A READY replica no longer wanted is drained, and stopped once DRAIN_S has passed on the
    monotonic clock, whatever the wall clock does meanwhile."""
    fleet.connect()
    fleet.controller.tick()
    rid = fleet.replica().id
    fleet.controller.observe("n1", Observed(rid, 1, P.READY, address="127.0.0.1:9"))
    assert fleet.replica().phase is P.READY
    assert rid in fleet.controller.hub.ready
    fleet.wants = []
    fleet.controller.tick()
    assert fleet.replica().phase is P.DRAINING
    assert rid not in fleet.controller.hub.ready
    fleet.clock.set_wall(fleet.clock.wall() + 3600)  # an NTP step forward: no drain ends
    fleet.controller.heartbeat("n1", [], 0)
    fleet.controller.tick()
    assert fleet.replica().phase is P.DRAINING
    fleet.clock.advance(DRAIN_S)
    fleet.controller.heartbeat("n1", [], 0)
    fleet.controller.tick()
    assert fleet.replica().phase is P.STOPPING


def test_a_silent_node_is_not_ready_then_lost_and_its_replica_replaced(fleet: Fleet) -> None:
    """No heartbeat for the grace makes the node NOT_READY (its replica stays); silence for
    the lost timeout makes it LOST, its replica is forgotten and a new one waits for a node."""
    fleet.connect()
    fleet.controller.tick()
    first = fleet.replica().id
    fleet.clock.advance(LIVENESS.grace_s)
    fleet.controller.tick()
    assert fleet.node_phase() is NodePhase.NOT_READY
    assert fleet.replica().id == first
    fleet.clock.advance(LIVENESS.lost_after_s - LIVENESS.grace_s)
    fleet.controller.tick()
    assert fleet.node_phase() is NodePhase.LOST
    r = fleet.replica()
    assert r.id != first and r.phase is P.PENDING
    assert r.reason.startswith("no READY node has 1 free L4 card")


def test_a_newer_connection_replaces_the_older(fleet: Fleet) -> None:
    """A second hello from the same node closes the first stream, saying why."""
    old = fleet.connect()
    new = fleet.connect(link=Link())
    assert old.closed == "replaced by a newer connection from the same node"
    assert fleet.controller.state.links["n1"] is new and not new.closed


def test_the_last_heartbeat_reads_as_wall_time(fleet: Fleet) -> None:
    """A node's last heartbeat, measured on the monotonic clock, is shown as the wall time it
    happened at."""
    fleet.connect()
    heard_at = fleet.clock.wall()
    fleet.clock.advance(4.0)
    view = fleet.controller.state.nodes["n1"]
    assert fleet.controller.wall_of(view.last_heard_s) == pytest.approx(heard_at)


def test_progress_is_the_agents_latest_while_starting_and_goes_with_the_phase(
    fleet: Fleet,
) -> None:
    """A STARTING replica keeps its agent's latest progress (a report without one clears it,
    a move that is no report keeps it), in the store too; READY or CRASHED drop it, and a
    replica starting again starts with none."""
    fleet.connect()
    fleet.controller.tick()
    rid = fleet.replica().id
    downloading = StartProgress("DOWNLOADING", 10, 100, 5, 0, 1, "m.gguf")
    loading = StartProgress("LOADING", file="m.gguf")

    def seen(phase: ReplicaPhase, progress: StartProgress | None) -> None:
        fleet.controller.observe("n1", Observed(rid, 1, phase, progress=progress))

    seen(P.STARTING, downloading)
    assert fleet.replica().progress == downloading
    inline(fleet.controller.flush())
    assert [r.progress for r in fleet.store.list_replicas()] == [progress_doc(downloading)]
    fleet.controller.transition(rid, P.STARTING, "still placed")
    assert fleet.replica().progress == downloading
    seen(P.STARTING, loading)
    assert fleet.replica().progress == loading
    seen(P.STARTING, None)
    assert fleet.replica().progress is None
    seen(P.STARTING, loading)
    seen(P.READY, None)
    assert fleet.replica().phase is P.READY and fleet.replica().progress is None
    seen(P.CRASHED, loading)  # a report's progress counts only while STARTING
    assert fleet.replica().progress is None
    seen(P.STARTING, None)
    assert fleet.replica().phase is P.STARTING and fleet.replica().progress is None


def test_versions_are_reserved_in_blocks_and_stay_above_every_one_sent(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The store holds a version at or above every one handed out, written once a block of
    versions, not once a tick: sets sent within the block write nothing; a restart goes on
    above the block."""
    links = [fleet.connect(f"n{i}") for i in range(3)]
    fleet.controller.tick()
    first = max(v for link in links for v, _ in link.sent)
    stored = int(fleet.store.get_value(VERSION_KEY) or 0)
    assert stored >= first + VERSION_BLOCK - 1
    fleet.wants = [replace(WANT, replicas=3)]
    fleet.controller.tick()
    sent = max(v for link in links for v, _ in link.sent)
    assert first < sent <= stored
    assert int(fleet.store.get_value(VERSION_KEY) or 0) == stored  # no write within the block
    again = Fleet(tmp_path, fleet.clock)
    link = again.connect()
    again.controller.tick()
    assert link.sent[0][0] > stored
    again.store.close()


def test_a_large_batch_counts_its_replica_lines_and_a_small_one_names_each(
    fleet: Fleet,
) -> None:
    """A tick that creates and places more replicas of a model than EACH_LOGGED writes one
    counting line of each kind (with the fields they share) and no line per replica at INFO;
    a tick of a few writes a line per replica, as before."""
    from structlog.testing import capture_logs

    from fleet_svc.controller.writes import EACH_LOGGED

    many = EACH_LOGGED + 4
    for i in range(many):
        fleet.connect(f"n{i:02d}")
    fleet.wants = [replace(WANT, replicas=many)]
    with capture_logs() as logs:
        fleet.controller.tick()
    info = [e for e in logs if e["log_level"] == "info"]
    assert not [e for e in info if e["event"] in ("replica_created", "replica_moved")]
    (created,) = [e for e in info if e["event"] == "replicas_created"]
    assert (created["replicas"], created["model"], created["profile"]) == (many, "m", "gpu")
    (placed,) = [e for e in info if e["event"] == "replicas_moved"]
    assert (placed["replicas"], placed["phase_from"], placed["phase"]) == (
        many,
        "PENDING",
        "STARTING",
    )
    assert "reason" not in placed  # "placed on <its node>": not shared, not in the count

    fleet.wants = [replace(WANT, replicas=many + 2)]
    for i in range(2):
        fleet.connect(f"m{i}")
    with capture_logs() as logs:
        fleet.controller.tick()
    assert len([e for e in logs if e["event"] == "replica_created"]) == 2
    assert len([e for e in logs if e["event"] == "replica_moved"]) == 2
    assert not [e for e in logs if e["event"] in ("replicas_created", "replicas_moved")]
