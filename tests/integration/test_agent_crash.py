"""Engines that crash, fail to start, hang or stop answering, as the agent reports them."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

from fleet_svc.agent.backoff import RestartLimit
from fleet_svc.agent.config import standin_engine
from llmgw.agent.v1 import agent_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet, spec
from tests.support.agents import fast_config, running_agent

STARTING = agent_pb2.PROCESS_PHASE_STARTING
HEALTHY = agent_pb2.PROCESS_PHASE_HEALTHY
UNHEALTHY = agent_pb2.PROCESS_PHASE_UNHEALTHY
CRASHED = agent_pb2.PROCESS_PHASE_CRASHED
FAILED = agent_pb2.PROCESS_PHASE_FAILED


async def test_killed_engine_is_restarted_with_backoff_and_each_crash_reported(
    tmp_path: Path,
) -> None:
    """kill -9 of an engine is reported as CRASHED (SIGKILL, restart delay), the engine comes
    back on a new pid with its restart count, and the second crash waits longer."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1"))
        first = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        os.kill(first.pid, signal.SIGKILL)
        crash = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == CRASHED), None)
        )
        assert crash.exit_code == -signal.SIGKILL
        assert "SIGKILL" in crash.message and "restarting in 0.2 s" in crash.message
        second = await assert_eventually(
            lambda: next(
                (u for u in fleet.updates_of("r1") if u.phase == HEALTHY and u.restarts == 1),
                None,
            )
        )
        assert second.pid != first.pid

        os.kill(second.pid, signal.SIGKILL)
        await assert_eventually(lambda: fleet.phases_of("r1").count(CRASHED) == 2)
        crashes = [u for u in fleet.updates_of("r1") if u.phase == CRASHED]
        assert "restarting in 0.4 s" in crashes[1].message, "the backoff doubled"
        await assert_eventually(
            lambda: any(u.phase == HEALTHY and u.restarts == 2 for u in fleet.updates_of("r1"))
        )


async def test_engine_failing_on_start_fails_past_the_limit_with_its_log(tmp_path: Path) -> None:
    """An engine that fails every start is restarted up to the limit, then FAILED with its
    exit code and the engine's own last log lines, and not started again."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1", args=["--load-s", "0.1", "--fail-on-start"]))
        failed = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == FAILED), None),
            timeout_s=15,
        )
        assert failed.exit_code == 1
        assert "3 crashes" in failed.message and "not restarting" in failed.message
        assert any("failed to load model" in line for line in failed.log_tail)
        assert fleet.phases_of("r1").count(CRASHED) == 2
        log_file = tmp_path / "logs" / "r1.log"
        assert "failed to load model" in log_file.read_text()


async def test_engine_stuck_loading_is_killed_after_its_start_timeout(tmp_path: Path) -> None:
    """An engine whose health never answers within its start timeout is killed and counted as
    a crash that says so."""
    engine = standin_engine("standin")
    slow = dataclasses.replace(engine, start_timeout_s=0.5)
    config = fast_config(engines={"standin": slow}, restart_limit=RestartLimit(1, 60.0))
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path, config=config):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1", args=["--load-s", "30"]))
        failed = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == FAILED), None)
        )
        assert "did not answer 200 within 0.5 s" in failed.message
        assert failed.exit_code == -signal.SIGKILL


async def test_engine_that_stops_answering_is_unhealthy_then_healthy_again(
    tmp_path: Path,
) -> None:
    """A healthy engine that stops answering its health checks is reported UNHEALTHY, and
    HEALTHY again when it answers."""
    config = fast_config(health_timeout_s=0.2)
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path, config=config):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1"))
        healthy = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        os.kill(healthy.pid, signal.SIGSTOP)
        try:
            await assert_eventually(lambda: UNHEALTHY in fleet.phases_of("r1"))
        finally:
            os.kill(healthy.pid, signal.SIGCONT)
        await assert_eventually(lambda: fleet.phases_of("r1")[-1] == HEALTHY)
        assert fleet.last("r1").pid == healthy.pid  # type: ignore[union-attr]
