"""The endpoint hub: numbered events, upserts, resuming from a sequence, snapshots when the
history is gone, heartbeats on idle streams, slow watchers cut off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from fleet_svc import watch
from fleet_svc.domain.canary import split_weights
from fleet_svc.domain.endpoints import Endpoint, EndpointReason
from fleet_svc.watch import EndpointEvent, EndpointHub, EventKind, Split, WatcherTooSlow

K = EventKind


def ep(rid: str, model: str = "m", address: str = "10.0.0.1:8000") -> Endpoint:
    """An endpoint of `model`."""
    return Endpoint(rid, model, "p", address, 1, "n1")


def hub(**kw: object) -> EndpointHub:
    """A hub on a fixed wall clock."""
    return EndpointHub(lambda: 1_700_000_000.0, epoch="e1", **kw)  # type: ignore[arg-type]


async def take(stream: AsyncIterator[EndpointEvent], n: int) -> list[EndpointEvent]:
    """The next `n` events."""
    return [await asyncio.wait_for(anext(stream), 5) for _ in range(n)]


def kinds(events: list[EndpointEvent]) -> list[tuple[EventKind, str, int]]:
    """(kind, replica id, seq) of each event."""
    return [(e.kind, e.endpoint.replica_id if e.endpoint else "", e.seq) for e in events]


async def test_changes_are_numbered_and_an_add_of_a_known_id_is_an_update() -> None:
    """ADDED, then UPDATED for the same id at a new address (an upsert), nothing for an
    unchanged put, REMOVED with its reason; each one more than the last."""
    h = hub()
    stream = h.watch()
    assert kinds(await take(stream, 1)) == [(K.SYNCED, "", 0)]
    h.put(ep("a"))
    h.put(ep("a"))
    h.put(ep("a", address="10.0.0.2:8000"))
    h.remove("a", EndpointReason.FAILED)
    h.remove("a", EndpointReason.FAILED)
    got = await take(stream, 3)
    assert kinds(got) == [(K.ADDED, "a", 1), (K.UPDATED, "a", 2), (K.REMOVED, "a", 3)]
    assert got[1].endpoint is not None and got[1].endpoint.address == "10.0.0.2:8000"
    assert got[2].reason is EndpointReason.FAILED
    assert {e.epoch for e in got} == {"e1"} and got[0].at_s == 1_700_000_000.0
    await stream.aclose()  # type: ignore[attr-defined]
    assert h.watchers == 0


async def test_snapshot_then_synced_carry_the_latest_sequence() -> None:
    """A fresh stream gets every routable endpoint of its model as ADDED, then SYNCED, all
    numbered with the latest sequence, SYNCED not resumed."""
    h = hub()
    h.put(ep("a"))
    h.put(ep("b", model="other"))
    h.put(ep("c"))
    got = await take(h.watch("m"), 3)
    assert kinds(got) == [(K.ADDED, "a", 3), (K.ADDED, "c", 3), (K.SYNCED, "", 3)]
    assert not got[-1].resumed and got[-1].note == ""


async def test_resume_sends_only_what_was_missed() -> None:
    """Resuming after sequence 2 of the same epoch sends the model's events 3.. and a SYNCED
    that says resumed, no snapshot."""
    h = hub()
    h.put(ep("a"))
    h.put(ep("b"))
    h.put(ep("x", model="other"))
    h.remove("a", EndpointReason.DRAINING)
    got = await take(h.watch("m", after_seq=2, epoch="e1"), 2)
    assert kinds(got) == [(K.REMOVED, "a", 4), (K.SYNCED, "", 4)]
    assert got[-1].resumed


@pytest.mark.parametrize(
    ("after_seq", "epoch", "note"),
    [
        (1, "e1", "older than the history kept"),
        (99, "e1", "past this fleet's last"),
        (3, "old-epoch", "is not this fleet's"),
    ],
)
async def test_resume_that_cannot_be_honoured_is_a_snapshot_that_says_why(
    after_seq: int, epoch: str, note: str
) -> None:
    """A sequence older than the history, newer than the hub's, or of another epoch gets a
    fresh snapshot and a SYNCED that is not resumed and names why."""
    h = hub(history=2)
    for rid in ("a", "b", "c", "d"):
        h.put(ep(rid))
    got = await take(h.watch(after_seq=after_seq, epoch=epoch), 5)
    assert [e.kind for e in got] == [K.ADDED] * 4 + [K.SYNCED]
    assert not got[-1].resumed and note in got[-1].note


async def test_resume_at_the_edge_of_the_history_is_honoured() -> None:
    """The oldest sequence still resumable is the one just before the first kept."""
    h = hub(history=2)
    for rid in ("a", "b", "c", "d"):
        h.put(ep(rid))
    got = await take(h.watch(after_seq=2, epoch="e1"), 3)
    assert kinds(got) == [(K.ADDED, "c", 3), (K.ADDED, "d", 4), (K.SYNCED, "", 4)]
    assert got[-1].resumed


async def test_idle_stream_gets_heartbeats_with_the_latest_sequence() -> None:
    """A stream with nothing to send gets a HEARTBEAT carrying the latest sequence."""
    h = hub(heartbeat_s=0.05)
    h.put(ep("a"))
    stream = h.watch()
    await take(stream, 2)
    beats = await take(stream, 2)
    assert [(e.kind, e.seq) for e in beats] == [(K.HEARTBEAT, 1), (K.HEARTBEAT, 1)]


async def test_filtered_stream_gets_heartbeats_while_other_models_change() -> None:
    """A stream of one model still gets heartbeats while only other models' endpoints
    change (their events are not its to send)."""
    h = hub(heartbeat_s=0.05)
    stream = h.watch("quiet")
    await take(stream, 1)
    stop = asyncio.Event()

    async def churn() -> None:
        i = 0
        while not stop.is_set():
            h.put(ep(f"x{i}", model="busy"))
            i += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(churn())
    try:
        beat = (await take(stream, 1))[0]
    finally:
        stop.set()
        await task
    assert beat.kind is K.HEARTBEAT and beat.endpoint is None
    assert 0 < beat.seq <= h.seq


async def test_slow_watcher_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watcher more than WATCHER_QUEUE events behind is cut off with WatcherTooSlow, and
    counted (llmgw_fleet_watchers_cut_total)."""
    monkeypatch.setattr(watch, "WATCHER_QUEUE", 3)
    h = hub()
    stream = h.watch()
    await take(stream, 1)
    assert h.cut == 0
    for i in range(5):
        h.put(ep(f"r{i}"))
    assert h.watchers == 0 and h.cut == 1
    await take(stream, 3)
    with pytest.raises(WatcherTooSlow):
        await take(stream, 1)


def test_heartbeat_interval_must_be_positive() -> None:
    """A zero heartbeat interval is refused when the hub is made."""
    with pytest.raises(ValueError, match="positive"):
        EndpointHub(heartbeat_s=0)


def test_a_weigher_sets_published_weights_and_reweighs_the_model_on_each_change() -> None:
    """With a weigher (a canary's split), a put publishes its endpoint at the split weight and
    UPDATEs the model's others whose weight moved; a remove reweighs the rest; another
    model's endpoints are untouched; reweigh() publishes a changed split."""
    h = hub()
    share = {"pct": 25}

    def weigh(model: str) -> Split | None:
        if model != "m":
            return None
        return lambda eps: split_weights(eps, 2, share["pct"])

    h.weigh = weigh
    old1, old2 = replace(ep("o1"), weight=100), replace(ep("o2"), weight=100)
    h.put(old1)
    h.put(old2)
    h.put(replace(ep("x", model="other"), weight=100))
    seq = h.seq
    h.put(replace(ep("c"), revision=2, weight=100))
    events = h.since(seq)
    assert [(e.kind, e.endpoint.replica_id) for e in events if e.endpoint] == [
        (K.ADDED, "c"),
        (K.UPDATED, "o1"),
        (K.UPDATED, "o2"),
    ]
    assert {rid: e.weight for rid, e in h.ready.items()} == {
        "o1": 113,
        "o2": 112,
        "c": 75,
        "x": 100,
    }
    share["pct"] = 50
    h.reweigh("m")
    assert {rid: e.weight for rid, e in h.ready.items() if rid != "x"} == {
        "o1": 75,
        "o2": 75,
        "c": 150,
    }
    h.remove("c", EndpointReason.DRAINING)
    assert {rid: e.weight for rid, e in h.ready.items()} == {"o1": 100, "o2": 100, "x": 100}


def test_an_unsplit_model_publishes_each_put_and_remove_alone() -> None:
    """With no split, a put or remove of one endpoint is the one event for it: the model's
    other endpoints are not published again."""
    h = hub()
    for i in range(5):
        h.put(ep(f"r{i}"))
    seq = h.seq
    h.put(ep("r5"))
    h.put(replace(ep("r2"), address="10.0.0.9:8000"))
    h.remove("r0", EndpointReason.DRAINING)
    assert [(e.kind, e.endpoint.replica_id) for e in h.since(seq) if e.endpoint] == [
        (K.ADDED, "r5"),
        (K.UPDATED, "r2"),
        (K.REMOVED, "r0"),
    ]
    assert sorted(h.ready) == ["r1", "r2", "r3", "r4", "r5"]


def test_a_split_that_ended_is_undone_by_the_next_change_of_its_model() -> None:
    """A model last published split whose weigher no longer splits it gets its own weights
    back at its next put, even before anyone calls reweigh()."""
    h = hub()
    splitting = {"on": True}

    def weigh(model: str) -> Split | None:
        return (lambda eps: split_weights(eps, 2, 25)) if splitting["on"] else None

    h.weigh = weigh
    h.put(replace(ep("o1"), weight=100))
    h.put(replace(ep("c"), revision=2, weight=100))
    assert {rid: e.weight for rid, e in h.ready.items()} == {"o1": 150, "c": 50}
    splitting["on"] = False
    h.put(replace(ep("o2"), weight=100))
    assert {rid: e.weight for rid, e in h.ready.items()} == {"o1": 100, "c": 100, "o2": 100}
    seq = h.seq
    h.put(replace(ep("o3"), weight=100))
    assert [e.endpoint.replica_id for e in h.since(seq) if e.endpoint] == ["o3"]
