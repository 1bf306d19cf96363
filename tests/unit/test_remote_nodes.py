"""The leader's side of agents other fleets hold (fleet_svc/nodelink/remote.py): node reports
read from the store become the controller's events, and a node's report survives its row."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path

from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, StartProgress
from fleet_svc.domain.reports import Observed
from fleet_svc.nodelink.remote import RemoteNodes, StoredLink
from fleet_svc.nodelink.reports import news_of, report_doc
from fleet_svc.store.base import NodeBeat, NodeReport
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.card import Card
from llmgw.rejection import Rejection

LIVENESS = Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=30.0)


class Heard:
    """Records the events a controller would get."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.links: dict[str, StoredLink] = {}

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: StoredLink
    ) -> None:
        self.links[view.name] = link
        ids = ",".join(sorted(o.replica_id for o in observed))
        self.events.append(("hello", view.name, link.stream, ids))

    def agent_disconnected(self, node: str, link: StoredLink) -> None:
        self.events.append(("bye", node, link.stream))

    def heartbeat(self, node: str, cards: Sequence[Card], memory_free_bytes: int) -> None:
        self.events.append(("beat", node, str(memory_free_bytes)))

    def observe(self, node: str, o: Observed) -> None:
        self.events.append(("observe", node, o.replica_id, o.phase.value))

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        self.events.append(("ack", node, str(version), ",".join(r.replica_id for r in rejected)))


def encode(node: str, version: int, rs: Sequence[ReplicaState], stop: Mapping[str, str]) -> bytes:
    return f"{node}:{version}:{len(rs)}".encode()


def row(
    node: str,
    stream: str,
    heard_at: float,
    *,
    free: int = 0,
    observed: tuple[Observed, ...] = (),
    ack: int = 0,
    holder: str = "f2",
    up: bool = True,
) -> NodeReport:
    """A node's row as a fleet holding its stream writes it."""
    view = NodeView(name=node, cards=(Card(0, model="H100"),), memory_free_bytes=free)
    return NodeReport(node, holder, stream, up, heard_at, report_doc(view, observed, ack, ()))


async def test_rows_become_a_hello_then_news_then_a_goodbye(tmp_path: Path) -> None:
    """A stream's first row is a hello with its replicas; later rows of the same stream give
    heartbeats, only the replica reports that changed, and acknowledgements that moved; a
    row saying the stream ended ends it; this fleet's own rows are skipped."""
    store = SQLiteStore(tmp_path / "f.db")
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    heard = Heard()
    starting = Observed("r1", 1, ReplicaPhase.STARTING)
    store.put_node_reports(
        [row("n1", "s1", 100.0, observed=(starting,)), row("n2", "x", 100.0, holder="f1")]
    )
    await remote.fetch()
    remote.apply_fetched(heard, 100.5)
    assert heard.events == [("hello", "n1", "s1", "r1")]
    ready = Observed("r1", 1, ReplicaPhase.READY, address="h:1")
    store.put_node_reports([row("n1", "s1", 101.0, free=7, observed=(ready,), ack=4)])
    await remote.fetch()
    remote.apply_fetched(heard, 101.0)
    assert heard.events[1:] == [
        ("beat", "n1", "7"),
        ("observe", "n1", "r1", "READY"),
        ("ack", "n1", "4", ""),
    ]
    store.put_node_reports([row("n1", "s1", 102.0, free=7, observed=(ready,), ack=4)])
    await remote.fetch()
    remote.apply_fetched(heard, 102.0)
    assert heard.events[4:] == [("beat", "n1", "7")], "no news is no event but the heartbeat"
    store.put_node_reports([row("n1", "s1", 102.0, free=7, observed=(ready,), ack=4)])
    await remote.fetch()
    remote.apply_fetched(heard, 105.0)
    assert len(heard.events) == 5, "a row refreshed over a silent stream is no heartbeat"
    store.put_node_reports([row("n1", "s1", 103.0, up=False)])
    await remote.fetch()
    remote.apply_fetched(heard, 106.0)
    assert heard.events[5:] == [("bye", "n1", "s1")]


async def test_a_new_stream_is_a_new_hello_and_a_replaced_one_is_no_news(tmp_path: Path) -> None:
    """The node's agent reconnects (to another fleet): a new hello; the old stream's link,
    once closed by the controller, makes its later rows no news."""
    store = SQLiteStore(tmp_path / "f.db")
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    heard = Heard()
    store.put_node_reports([row("n1", "s1", 100.0)])
    await remote.fetch()
    remote.apply_fetched(heard, 100.0)
    store.put_node_reports([row("n1", "s2", 101.0, holder="f3")])
    await remote.fetch()
    remote.apply_fetched(heard, 101.0)
    assert [e[:3] for e in heard.events] == [("hello", "n1", "s1"), ("hello", "n1", "s2")]
    heard.links["n1"].close("replaced")
    store.put_node_reports([row("n1", "s2", 102.0, holder="f3", free=1)])
    await remote.fetch()
    remote.apply_fetched(heard, 102.0)
    assert len(heard.events) == 2


async def test_a_leader_loading_rows_skips_streams_gone_quiet(tmp_path: Path) -> None:
    """On its first read (it just took over) a stream whose row was last refreshed longer
    ago than the grace is not taken for a connected node: its holder stopped refreshing it."""
    store = SQLiteStore(tmp_path / "f.db")
    store.put_node_reports([row("old", "s1", 100.0), row("fresh", "s2", 109.0)])
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    heard = Heard()
    await remote.fetch()
    remote.apply_fetched(heard, 110.0)
    assert [e[1] for e in heard.events] == ["fresh"]


async def test_a_holder_s_beat_is_a_heartbeat_for_each_of_its_nodes_heard_since(
    tmp_path: Path,
) -> None:
    """A holder's beat gives a heartbeat for each node whose stream it holds and whose agent
    spoke since (its heard_at moved), none for a silent one, none for a node another fleet
    holds now or whose stream the controller let go, and none from this fleet's own beat."""
    store = SQLiteStore(tmp_path / "f.db")
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    heard = Heard()
    store.put_node_reports(
        [
            row("talker", "s1", 100.0, free=3),
            row("quiet", "s2", 100.0),
            row("moved", "s3", 100.0, holder="f3"),
            row("let-go", "s4", 100.0),
        ],
        NodeBeat("f2", {"talker": 100.0, "quiet": 100.0, "let-go": 100.0}, 100.0),
    )
    await remote.fetch()
    remote.apply_fetched(heard, 100.0)
    assert sorted(e[1] for e in heard.events) == ["let-go", "moved", "quiet", "talker"]
    heard.events.clear()
    heard.links["let-go"].close("replaced")
    store.put_node_reports(
        [],
        NodeBeat("f2", {"talker": 101.0, "quiet": 100.0, "moved": 101.0, "let-go": 101.0}, 101.0),
    )
    store.put_node_reports([], NodeBeat("f1", {"quiet": 101.0}, 101.0))
    await remote.fetch()
    remote.apply_fetched(heard, 101.0)
    assert heard.events == [("beat", "talker", "3")]
    await remote.fetch()
    remote.apply_fetched(heard, 101.5)
    assert heard.events == [("beat", "talker", "3")], "a beat read once is not read again"


async def test_a_leader_loading_rows_takes_a_node_its_holder_s_last_beat_heard(
    tmp_path: Path,
) -> None:
    """On its first read a node whose row is old (its report has not changed for a while) is
    taken for connected when its holder's last beat heard its agent within the grace, and
    skipped when that beat is old too or does not name it."""
    store = SQLiteStore(tmp_path / "f.db")
    store.put_node_reports(
        [row("beating", "s1", 50.0), row("silent", "s2", 50.0), row("unnamed", "s3", 50.0)],
        NodeBeat("f2", {"beating": 109.0, "silent": 60.0}, 109.0),
    )
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    heard = Heard()
    await remote.fetch()
    remote.apply_fetched(heard, 110.0)
    assert [e[1] for e in heard.events] == ["beating"]


async def test_desired_sets_go_to_the_store_at_the_next_push(tmp_path: Path) -> None:
    """A set sent on a stored link is written at the next push, the newest per node."""
    store = SQLiteStore(tmp_path / "f.db")
    remote = RemoteNodes(store, "f1", encode, LIVENESS)
    link = StoredLink("n1", "f2", "s1", remote)
    link.send_desired(1, [], {})
    link.send_desired(2, [], {})
    await remote.push()
    assert [(d.node, d.version, d.body) for d in store.list_desired()] == [("n1", 2, b"n1:2:0")]
    link.close("replaced")
    link.send_desired(3, [], {})
    await remote.push()
    assert len(store.list_desired()) == 1, "a closed link sends nothing"


def test_a_damaged_report_reads_as_an_empty_one() -> None:
    """Fields of the wrong type read as absent and a replica report that does not decode is
    left out: the node's view stands with what did decode."""
    news = news_of(
        "n1",
        {
            "view": {"cards": [{"index": "zero"}, 3], "labels": {"a": 1, "b": "c"}},
            "observed": [
                {"replica_id": "r", "phase": "DANCING"},
                {"replica_id": "q", "phase": "READY"},
            ],
            "ack": {"version": True, "rejected": "no"},
        },
    )
    assert news.view.labels == {"b": "c"}
    assert news.view.cards == (Card(0),)
    assert list(news.observed) == ["q"]
    assert (news.ack_version, news.rejected) == (0, ())


def test_every_field_of_a_replica_report_survives_the_row() -> None:
    """A replica report with every field set (its start progress too) reads back from a node's
    row equal to what the agent sent: an agent on a follower is seen as one on the leader."""
    sent = Observed(
        replica_id="r-1",
        revision=3,
        phase=ReplicaPhase.STARTING,
        address="10.0.0.5:8000",
        restarts=2,
        message="fetching weights",
        log_tail=("a", "b"),
        gpus=(0, 1),
        gang_address="10.0.0.5:29500",
        progress=StartProgress(
            stage="DOWNLOADING",
            done_bytes=10,
            total_bytes=100,
            rate_bytes_per_s=5,
            files_done=1,
            files_total=4,
            file="model-00001.safetensors",
        ),
    )
    unset = [f.name for f in fields(Observed) if getattr(sent, f.name) == f.default]
    assert unset == [], f"set every field in this fixture: {unset}"
    view = NodeView(name="n1", cards=(Card(0, model="H100"),))
    news = news_of("n1", report_doc(view, (sent,), 0, ()))
    assert news.observed == {"r-1": sent}


def test_a_row_read_again_with_the_same_report_object_is_only_a_heartbeat() -> None:
    """A refreshed row whose store read gave back the very report object of the last read
    (PostgreSQL's reader does when the text is the same) is a heartbeat when its heard_at
    moved and nothing else; a new report object is compared as ever."""
    remote = RemoteNodes(None, "f1", encode, LIVENESS)  # type: ignore[arg-type]
    heard = Heard()
    first = row("n1", "s1", 100.0, observed=(Observed("r1", 1, ReplicaPhase.STARTING),))
    remote.apply([first], heard, 100.0)
    again = NodeReport("n1", "f2", "s1", True, 101.0, first.report, seq=2)
    remote.apply([again], heard, 101.0)
    remote.apply([again], heard, 101.0)  # heard_at did not move: no heartbeat
    ready = row("n1", "s1", 102.0, observed=(Observed("r1", 1, ReplicaPhase.READY),))
    remote.apply([ready], heard, 102.0)
    assert heard.events == [
        ("hello", "n1", "s1", "r1"),
        ("beat", "n1", "0"),
        ("beat", "n1", "0"),
        ("observe", "n1", "r1", "READY"),
    ]
