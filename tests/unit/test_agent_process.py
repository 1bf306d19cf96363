"""Run records: what a restarted agent reads to adopt the engines an earlier one left."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_svc.agent import claims
from fleet_svc.agent.cards import StandinCards, parse_gpu_spec
from fleet_svc.agent.config import AgentConfig, standin_engine
from fleet_svc.agent.process import RunRecord, process_start_ticks, read_records
from fleet_svc.agent.replica import ReplicaSpec
from fleet_svc.agent.replicas import ReplicaSet


def test_run_record_round_trips() -> None:
    """A record read back is the record written."""
    spec = ReplicaSpec("r1", 4, "vllm", "m", "p", ("--x", "1"), (0, 1), "/w")
    record = RunRecord(spec, pid=42, port=8000, start_ticks=123, restarts=2)
    assert RunRecord.from_json(record.to_json()) == record


def test_start_ticks_identify_a_live_process() -> None:
    """This process has a start time in ticks, stable between reads."""
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None and ticks == process_start_ticks(os.getpid())


def test_unreadable_records_are_skipped(tmp_path: Path) -> None:
    """A record that is not one is skipped, the others read."""
    good = RunRecord(ReplicaSpec("a", 1, "standin"), 1, 2, None, 0)
    (tmp_path / "a.json").write_text(good.to_json())
    (tmp_path / "b.json").write_text('{"pid": 1}')
    assert read_records(tmp_path) == [good]


async def test_records_of_gone_processes_are_dropped_with_their_claims(tmp_path: Path) -> None:
    """At start an agent drops the records of engines that are gone and their card claims,
    adopting nothing."""
    dead_pid = 2**22 + 7  # past Linux's largest possible pid (2**22): no such process
    cards = StandinCards(parse_gpu_spec("1xL4-24GB"), tmp_path)
    claims.claim(cards.cards_dir, 0, dead_pid, 99)
    records = tmp_path / "replicas"
    records.mkdir()
    record = RunRecord(ReplicaSpec("r1", 1, "standin", gpus=(0,)), dead_pid, 1234, None, 0)
    (records / "r1.json").write_text(record.to_json())
    replicas = ReplicaSet(
        AgentConfig(engines={"standin": standin_engine("standin")}), cards, tmp_path
    )
    try:
        assert replicas.adopt() == []
        assert not (records / "r1.json").exists()
        assert claims.claimed_by(cards.cards_dir, dead_pid) == []
        assert replicas.observed() == []
    finally:
        await replicas.aclose()
