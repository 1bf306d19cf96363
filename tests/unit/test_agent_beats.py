"""The fleet's heartbeats on its agents' streams (fleet_svc/rpc/agent_stream.py): each stream
beats once an interval, at the instants of its slot, so that the streams of one slot are woken
together."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet_svc.rpc.agent_stream import BEAT_SLOTS, AgentServicer, StreamLink, beat_delay
from llmgw.testing.clock import FakeClock


@pytest.mark.parametrize("interval_s", [2.0, 0.5, 7.3])
def test_every_beat_of_a_slot_lands_on_its_instants_one_interval_apart(interval_s: float) -> None:
    """From any moment, a slot's next beat is within one interval and lands on the slot's
    instant (slot / BEAT_SLOTS of the interval past a multiple of it); from that instant the
    next is one whole interval on, never 0."""
    for slot in range(BEAT_SLOTS):
        offset = interval_s * slot / BEAT_SLOTS
        for now in (0.0, 0.013, offset, offset + 1e-7, 1234.567, 98765.4321):
            delay = beat_delay(now, interval_s, slot)
            assert 0 < delay <= interval_s
            at = now + delay
            assert (at - offset) % interval_s == pytest.approx(0, abs=1e-6) or (
                (at - offset) % interval_s == pytest.approx(interval_s, abs=1e-6)
            )
        assert beat_delay(100 * interval_s + offset, interval_s, slot) == pytest.approx(interval_s)


def test_streams_share_at_most_beat_slots_instants() -> None:
    """However many streams join at whatever moments, their beats fall on BEAT_SLOTS instants
    of the interval at most: a slot's streams beat together."""
    interval_s = 2.0
    joined = [0.001 * i * 37 % 5.0 for i in range(200)]
    phases = {
        round((now + beat_delay(now, interval_s, i % BEAT_SLOTS)) % interval_s, 6)
        for i, now in enumerate(joined)
    }
    assert len(phases) <= BEAT_SLOTS
    assert len(phases) == BEAT_SLOTS  # 200 streams fill every slot


def test_slots_past_the_last_wrap_around() -> None:
    """A slot number is taken modulo BEAT_SLOTS: the eleventh stream shares the first's."""
    assert beat_delay(3.21, 2.0, BEAT_SLOTS + 3) == beat_delay(3.21, 2.0, 3)


class _NoSink:
    """The little of an AgentSink a servicer's constructor keeps (nothing is called here)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the beat called the sink's {name}")


async def test_a_stream_gets_one_heartbeat_each_interval_in_order() -> None:
    """A stream's beater sends heartbeats numbered 1, 2, 3 ... with the fleet's wall clock, one
    an interval (counted by the loop's clock, not asserted in time), on each of two streams."""
    clock = FakeClock()
    servicer = AgentServicer(_NoSink(), clock, node_certificates=False)
    links = [StreamLink("n1"), StreamLink("n2")]
    tasks = [asyncio.create_task(servicer._beat(link, 0.05)) for link in links]
    try:
        for link in links:
            seqs = []
            for _ in range(3):
                msg = await asyncio.wait_for(link.queue.get(), timeout=5)
                assert msg is not None and msg.HasField("heartbeat")
                assert msg.heartbeat.sent_at.ToNanoseconds() == int(clock.wall() * 1e9)
                seqs.append(msg.heartbeat.seq)
            assert seqs == [1, 2, 3]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
