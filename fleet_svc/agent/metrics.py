"""The node agent's metrics: whether its stream to the fleet is up, its replicas by phase and
its cards, read at every scrape (on the agent's event loop, llmgw.metrics)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleet_svc.agent.replica import Phase
from fleet_svc.agent.replicas import ReplicaSet
from fleet_svc.agent.rpc.client import AgentClient


class AgentCollector(Collector):
    """`llmgw_agent_connected`, `llmgw_agent_replicas{phase}`, `llmgw_agent_cards`."""

    def __init__(self, client: AgentClient, replicas: ReplicaSet) -> None:
        self._client = client
        self._replicas = replicas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "llmgw_agent_connected",
            "1 while the agent's stream to the fleet is open and welcomed, else 0.",
            value=1 if self._client.connected.is_set() else 0,
        )
        counts = {phase: 0 for phase in Phase}
        for obs in self._replicas.observed():
            counts[obs.phase] += 1
        family = GaugeMetricFamily(
            "llmgw_agent_replicas", "Replicas this agent runs, by phase.", labels=["phase"]
        )
        for phase, n in counts.items():
            family.add_metric([phase.value], n)
        yield family
        yield GaugeMetricFamily(
            "llmgw_agent_cards",
            "Cards this agent reports.",
            value=len(self._replicas.card_indices),
        )


def add_agent_metrics(
    registry: CollectorRegistry, client: AgentClient, replicas: ReplicaSet
) -> None:
    """Put the agent's collector in `registry`."""
    registry.register(AgentCollector(client, replicas))
