"""A real node agent in-process for tests (stand-in cards, the stream client, real engine
processes), with a config that checks and restarts quickly; run it against
llmgw.testing.fake_fleet."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_svc.agent.backoff import Backoff, RestartLimit
from fleet_svc.agent.cards import StandinCards, parse_gpu_spec
from fleet_svc.agent.config import AgentConfig, standin_engine
from fleet_svc.agent.replicas import ReplicaSet
from fleet_svc.agent.rpc.client import AgentClient, NodeIdentity
from fleet_svc.agent.runner_context import Spans


def fast_config(**overrides: Any) -> AgentConfig:
    """An agent config for tests: the stand-in as `standin` and as `vllm` (with vLLM's
    argument refusals), checked every 0.1 s, restarted after 0.2, 0.4, 0.8 … s."""
    settings: dict[str, Any] = {
        "engines": {"standin": standin_engine("standin"), "vllm": standin_engine("vllm")},
        "health_interval_s": 0.1,
        "health_timeout_s": 1.0,
        "unhealthy_after": 2,
        "restart_backoff": Backoff(base_s=0.2, factor=2.0, cap_s=1.0, jitter=0.0),
        "restart_limit": RestartLimit(max_crashes=3, window_s=60.0),
    }
    settings.update(overrides)
    return AgentConfig(**settings)


# Reconnect quickly in tests: 0.1 s, 0.2 s, then every 0.4 s.
FAST_RECONNECT = Backoff(base_s=0.1, factor=2.0, cap_s=0.4, jitter=0.0)


@dataclass
class Agent:
    """A node agent running in-process."""

    client: AgentClient
    replicas: ReplicaSet
    state_dir: Path
    task: asyncio.Task[None]


@asynccontextmanager
async def running_agent(
    port: int,
    state_dir: Path,
    gpus: str = "2xH100-80GB",
    config: AgentConfig | None = None,
    node: str = "node-1",
    reconnect: Backoff = FAST_RECONNECT,
    spans: Spans | None = None,
    fleet: str = "",
) -> AsyncIterator[Agent]:
    """Run a real agent (stand-in cards, the stream client, real engine processes) against
    the fleet on `port` (or the fleet addresses `fleet` names), its replicas' starts and stops
    traced through `spans` when given; on exit stop its replicas and wait until they are gone."""
    cards = StandinCards(parse_gpu_spec(gpus), state_dir)
    replicas = ReplicaSet(config or fast_config(), cards, state_dir, spans=spans)
    client = AgentClient(
        fleet or f"127.0.0.1:{port}",
        NodeIdentity(node, {"zone": "test"}),
        replicas,
        backoff=reconnect,
    )
    task = asyncio.create_task(client.run())
    try:
        yield Agent(client, replicas, state_dir, task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await replicas.aclose(stop_replicas=True)
