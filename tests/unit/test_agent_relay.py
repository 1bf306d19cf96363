"""A follower's side of the agents' streams it holds (fleet_svc/rpc/agent_relay.py): their
reports written to the store, and only the desired sets the leader wrote after the stream was
recorded forwarded to it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.reports import Observed
from fleet_svc.nodelink.reports import news_of
from fleet_svc.rpc.agent_relay import DONE_KEPT_S, MAX_OBSERVED, NodeRelay, encode_desired
from fleet_svc.rpc.agent_stream import StreamLink
from fleet_svc.store.base import DesiredRecord
from fleet_svc.store.sqlite import SQLiteStore
from fleet_svc.store_calls import StoreCalls
from llmgw.card import Card
from llmgw.testing.clock import FakeClock

LIVENESS = Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=30.0)


async def settle(relay: NodeRelay) -> None:
    """Let the relay's loop write and read once or twice."""
    relay.notified()
    for _ in range(4):
        await asyncio.sleep(0.08)


async def test_a_follower_writes_its_streams_and_forwards_only_later_sets(tmp_path: Path) -> None:
    """Following, a hello and a report are written as the node's row (holder, stream, view,
    replica report); a desired set written before the relay's first read is an older
    leader's and is not sent; one written after is sent to that node's stream as stored,
    none to another's; a stream that ends is written disconnected."""
    store = SQLiteStore(tmp_path / "f.db")
    store.put_desired([DesiredRecord("n1", 7, encode_desired("n1", 7, [], {}))])
    relay = NodeRelay(store, FakeClock(), "fleet-b", LIVENESS, StoreCalls(store))
    relay.follow()
    task = asyncio.create_task(relay.run())
    try:
        link = StreamLink("n1")
        view = NodeView(name="n1", cards=(Card(0, model="H100-80GB"),))
        relay.agent_connected(view, [], link)
        relay.observe("n1", Observed("r1", 1, ReplicaPhase.READY, address="h:1"))
        await settle(relay)
        [row] = store.list_node_reports()
        assert (row.node, row.holder, row.connected) == ("n1", "fleet-b", True)
        news = news_of("n1", row.report)
        assert news.view.cards == view.cards
        assert list(news.observed) == ["r1"]
        assert link.queue.empty(), "the set written before the stream was recorded is not sent"
        store.put_desired(
            [
                DesiredRecord("n1", 8, encode_desired("n1", 8, [], {})),
                DesiredRecord("n2", 9, encode_desired("n2", 9, [], {})),
            ]
        )
        await settle(relay)
        sent = link.queue.get_nowait()
        assert sent is not None and sent.desired.version == 8
        assert link.queue.empty()
        relay.agent_disconnected("n1", link)
        await settle(relay)
        [gone] = store.list_node_reports(row.seq)
        assert (gone.node, gone.connected, gone.stream) == ("n1", False, row.stream)
    finally:
        task.cancel()


async def test_a_stream_s_row_keeps_at_most_max_observed_replicas(tmp_path: Path) -> None:
    """An agent reporting more replicas than MAX_OBSERVED cannot grow its node's row past
    that: the reports of the ones beyond are dropped (a replica already kept is updated)."""
    store = SQLiteStore(tmp_path / "f.db")
    relay = NodeRelay(store, FakeClock(), "fleet-b", LIVENESS, StoreCalls(store))
    relay.follow()
    task = asyncio.create_task(relay.run())
    try:
        relay.agent_connected(NodeView(name="n1"), [], StreamLink("n1"))
        for i in range(MAX_OBSERVED + 5):
            relay.observe("n1", Observed(f"r{i}", 1, ReplicaPhase.STARTING))
        relay.observe("n1", Observed("r0", 1, ReplicaPhase.READY))
        await settle(relay)
        [row] = store.list_node_reports()
        news = news_of("n1", row.report)
        assert len(news.observed) == MAX_OBSERVED
        assert f"r{MAX_OBSERVED}" not in news.observed
        assert news.observed["r0"].phase is ReplicaPhase.READY
    finally:
        task.cancel()


async def test_each_interval_one_beat_names_every_stream_and_no_row_is_written_again(
    tmp_path: Path,
) -> None:
    """While following, a hello's row is written once; then every heartbeat interval one beat
    holds when each agent held here was last heard (a silent one keeps its old time), and no
    node's row is written again while its report stays the same; a beat is not written
    before its interval is up, and a stream that ended leaves the next beat."""
    store = SQLiteStore(tmp_path / "f.db")
    clock = FakeClock()
    relay = NodeRelay(store, clock, "fleet-b", LIVENESS, StoreCalls(store))
    relay.follow()
    clock.set_wall(1000.0)
    links = {name: StreamLink(name) for name in ("quiet", "talker")}
    for name, link in links.items():
        relay.agent_connected(NodeView(name=name), [], link)
    await relay._write()
    rows = store.list_node_reports()
    assert sorted(r.node for r in rows) == ["quiet", "talker"]
    [beat] = store.list_node_beats()
    assert (beat.holder, beat.heard) == ("fleet-b", {"quiet": 1000.0, "talker": 1000.0})
    top = max(r.seq for r in rows)
    clock.set_wall(1000.5)
    relay.heartbeat("talker", [], 0)
    await relay._write()
    assert store.list_node_beats(beat.seq) == [], "the next beat is an interval after the last"
    clock.set_wall(1001.0)
    await relay._write()
    [beat] = store.list_node_beats(beat.seq)
    assert beat.heard == {"quiet": 1000.0, "talker": 1000.5}
    assert store.list_node_reports(top) == [], "no report changed: no row is written again"
    relay.agent_disconnected("talker", links["talker"])
    clock.set_wall(1002.0)
    await relay._write()
    [gone] = store.list_node_reports(top)
    assert (gone.node, gone.connected) == ("talker", False)
    [beat] = store.list_node_beats(beat.seq)
    assert beat.heard == {"quiet": 1000.0}
    store.close()


async def test_a_stream_s_row_follows_each_change_after_refreshes_that_had_none(
    tmp_path: Path,
) -> None:
    """A row refreshed with nothing new keeps its report, and the next write after a change
    (a replica's report, an acknowledgement, a heartbeat's cards or free memory, a finished
    replica dropped DONE_KEPT_S after it was written) carries it: the report kept between
    writes is never stale."""
    store = SQLiteStore(tmp_path / "f.db")
    clock = FakeClock()
    relay = NodeRelay(store, clock, "fleet-b", LIVENESS, StoreCalls(store))
    relay.follow()
    task = asyncio.create_task(relay.run())

    async def latest() -> Any:
        await settle(relay)
        rows = store.list_node_reports()
        return max(rows, key=lambda r: r.seq).report

    try:
        relay.agent_connected(NodeView(name="n1", memory_free_bytes=5), [], StreamLink("n1"))
        first = await latest()
        clock.advance(LIVENESS.interval_s)
        relay.heartbeat("n1", [], 5)
        assert await latest() == first  # refreshed, nothing new
        relay.observe("n1", Observed("r1", 1, ReplicaPhase.STARTING))
        assert [o["replica_id"] for o in (await latest())["observed"]] == ["r1"]
        relay.acknowledged("n1", 4, [])
        assert (await latest())["ack"]["version"] == 4
        clock.advance(LIVENESS.interval_s)  # a heartbeat is written with the row's refresh
        relay.heartbeat("n1", [Card(0, model="L4")], 9)
        news = news_of("n1", await latest())
        assert (news.view.cards, news.view.memory_free_bytes) == ((Card(0, model="L4"),), 9)
        relay.observe("n1", Observed("r1", 1, ReplicaPhase.STOPPED))
        assert news_of("n1", await latest()).observed["r1"].phase is ReplicaPhase.STOPPED
        clock.advance(LIVENESS.interval_s)
        relay.heartbeat("n1", [], 9)
        assert news_of("n1", await latest()).observed, "kept while the leader may not have read it"
        clock.advance(DONE_KEPT_S)
        relay.heartbeat("n1", [], 9)
        await settle(relay)  # dropped at this beat, written at the next
        clock.advance(LIVENESS.interval_s)
        assert not news_of("n1", await latest()).observed  # written, then dropped
    finally:
        task.cancel()
