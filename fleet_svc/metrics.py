"""The fleet's own metrics: replicas and nodes by phase, connected agents and how long since
each was heard, running and ended rollouts (by outcome, with durations) and the age of the
oldest running one, canaries (their step, weight, figures per revision, verdicts), leadership,
whether the store answers, and the endpoint watchers (open, and cut off for falling behind).
deploy/monitoring's alerts are written on these.

Gauges are read from the controller's state at every scrape, on the event loop (the endpoint
runs there, llmgw.metrics); rollout outcomes are counted as they end, through the controller's
rollout listeners. Nothing here writes fleet state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fleet_svc.controller import Controller
from fleet_svc.domain.nodes import NodePhase
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.rollout import Event, EventKind, Rollout, in_canary
from llmgw.clock import Clock

ROLLOUT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
"""Rollout durations: a stand-in replica (seconds) to a fleet of large vLLM models (an hour)."""


@dataclass(frozen=True)
class Leadership:
    """Whether this fleet leads, and the fencing epoch of the lease it holds (or last saw)."""

    leading: bool
    epoch: int


def sole_leader() -> Leadership:
    """The leadership of a fleet that shares its store with nobody: it leads, epoch 0."""
    return Leadership(True, 0)


class FleetCollector(Collector):
    """The gauges read from the controller at each scrape."""

    def __init__(
        self,
        controller: Controller,
        clock: Clock,
        leadership: Callable[[], Leadership],
        store_problem: Callable[[], str | None],
        streams: Callable[[], int] | None = None,
    ) -> None:
        self._streams = streams
        self._controller = controller
        self._clock = clock
        self._leadership = leadership
        self._store_problem = store_problem

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self._controller.state
        replicas = GaugeMetricFamily(
            "llmgw_fleet_replicas", "Replicas the fleet keeps, by phase.", labels=["phase"]
        )
        counts = {phase: 0 for phase in ReplicaPhase}
        for r in state.replicas.values():
            counts[r.phase] += 1
        for phase, n in counts.items():
            replicas.add_metric([phase.value], n)
        yield replicas

        nodes = GaugeMetricFamily("llmgw_fleet_nodes", "Nodes known, by phase.", labels=["phase"])
        node_counts = {phase: 0 for phase in NodePhase}
        for view in state.nodes.values():
            node_counts[view.phase] += 1
        for node_phase, n in node_counts.items():
            nodes.add_metric([node_phase.value], n)
        yield nodes

        yield GaugeMetricFamily(
            "llmgw_fleet_agents_connected",
            "Agents with a stream open to this fleet.",
            value=self._streams() if self._streams is not None else len(state.links),
        )
        lag = GaugeMetricFamily(
            "llmgw_fleet_agent_heartbeat_lag_seconds",
            "Seconds since each connected agent was last heard (a heartbeat or any message).",
            labels=["node"],
        )
        now_s = self._clock.monotonic()
        for name in sorted(state.links):
            heard = state.nodes.get(name)
            if heard is not None:
                lag.add_metric([name], max(0.0, now_s - heard.last_heard_s))
        yield lag

        yield GaugeMetricFamily(
            "llmgw_fleet_rollouts_running",
            "Rollouts under way.",
            value=len(self._controller.rollouts),
        )
        running = [ro.created_s for ro in self._controller.rollouts.values() if ro.created_s > 0]
        yield GaugeMetricFamily(
            "llmgw_fleet_rollout_oldest_running_seconds",
            "Seconds since the oldest running rollout was created (0 with none running).",
            value=max(0.0, self._clock.wall() - min(running)) if running else 0.0,
        )
        yield from canary_gauges(self._controller.rollouts.values())
        yield GaugeMetricFamily(
            "llmgw_fleet_store_up",
            "1 while the store answers this fleet's probes (fleet_svc.store_health), else 0.",
            value=1 if self._store_problem() == "" else 0,
        )
        hub = self._controller.hub
        yield GaugeMetricFamily(
            "llmgw_fleet_watchers", "WatchReplicas streams open.", value=hub.watchers
        )
        yield CounterMetricFamily(
            "llmgw_fleet_watchers_cut",
            "WatchReplicas streams cut off for falling too far behind (they watch again).",
            value=hub.cut,
        )
        lead = self._leadership()
        yield GaugeMetricFamily(
            "llmgw_fleet_leader",
            "1 while this fleet holds the leadership (runs the controller), else 0.",
            value=1 if lead.leading else 0,
        )
        yield GaugeMetricFamily(
            "llmgw_fleet_leader_epoch",
            "The fencing epoch of the leadership lease this fleet holds or last saw.",
            value=lead.epoch,
        )


def canary_gauges(rollouts: Iterable[Rollout]) -> Iterator[GaugeMetricFamily]:
    """Each canary being judged: its step (1-based), the new revision's weight, and the
    figures of its last analysis per revision (`role` canary or baseline)."""
    step = GaugeMetricFamily(
        "llmgw_fleet_canary_step",
        "The step a canary is at (1-based; 0 until its replicas are ready).",
        labels=["model", "rollout"],
    )
    weight = GaugeMetricFamily(
        "llmgw_fleet_canary_weight_percent",
        "The new revision's share of its model's weight during a canary.",
        labels=["model", "rollout"],
    )
    names = {
        "requests": "Requests the gateways reported in the canary step's window",
        "error_ratio": "5xx and timeouts per request in the canary step's window",
        "context_refusal_ratio": "Context-length refusals per request in the step's window",
        "p99_ttft_ms": "p99 time to first token in the canary step's window",
        "p99_itl_ms": "p99 inter-token latency in the canary step's window",
    }
    figures = {
        key: GaugeMetricFamily(
            f"llmgw_fleet_canary_{key}",
            f"{text}, per revision.",
            labels=["model", "revision", "role"],
        )
        for key, text in names.items()
    }
    for ro in rollouts:
        run = ro.canary
        if run is None or not in_canary(ro):
            continue
        step.add_metric([ro.model, ro.id], run.step + 1 if run.started else 0)
        weight.add_metric([ro.model, ro.id], run.weight_percent)
        for role, revision, f in (
            ("canary", ro.to_revision, run.canary),
            ("baseline", ro.from_revision, run.baseline),
        ):
            for key, family in figures.items():
                family.add_metric([ro.model, str(revision), role], float(getattr(f, key)))
    yield step
    yield weight
    yield from figures.values()


class CanaryMetrics:
    """Counts canary analyses by verdict as they are recorded:
    `llmgw_fleet_canary_verdicts_total{verdict}` (promote, hold, fail)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.verdicts = Counter(
            "llmgw_fleet_canary_verdicts",
            "Canary analyses recorded, by verdict (a hold is counted when its reason changes).",
            ["verdict"],
            registry=registry,
        )
        for verdict in ("promote", "hold", "fail"):
            self.verdicts.labels(verdict)

    def __call__(self, ro: Rollout, event: Event) -> None:
        """Count one event if it is a canary's analysis."""
        run = event.canary
        if event.kind is EventKind.CANARY_ANALYSIS and run is not None and run.verdict.value:
            self.verdicts.labels(run.verdict.value).inc()


class RolloutMetrics:
    """Counts and times rollouts as they end: `llmgw_fleet_rollouts_total{outcome}` and
    `llmgw_fleet_rollout_duration_seconds{outcome}` (outcome SUCCEEDED, FAILED, CANCELLED)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ended = Counter(
            "llmgw_fleet_rollouts", "Rollouts ended, by outcome.", ["outcome"], registry=registry
        )
        self.seconds = Histogram(
            "llmgw_fleet_rollout_duration_seconds",
            "How long rollouts took from creation to their end, by outcome.",
            ["outcome"],
            buckets=ROLLOUT_BUCKETS_S,
            registry=registry,
        )
        for outcome in ("SUCCEEDED", "FAILED", "CANCELLED"):
            self.ended.labels(outcome)  # every outcome's series exists from the start, at 0

    def __call__(self, ro: Rollout) -> None:
        """Count one rollout that ended."""
        outcome = ro.state.value
        self.ended.labels(outcome).inc()
        if ro.created_s > 0 and ro.updated_s >= ro.created_s:
            self.seconds.labels(outcome).observe(ro.updated_s - ro.created_s)


def add_fleet_metrics(
    registry: CollectorRegistry,
    controller: Controller,
    clock: Clock,
    leadership: Callable[[], Leadership] = sole_leader,
    store_problem: Callable[[], str | None] = lambda: "",
    streams: Callable[[], int] | None = None,
) -> None:
    """Put the fleet's collectors in `registry`, its rollout counters listening on
    `controller` (the RPC series are the server interceptor's, llmgw.metrics.RpcMetrics);
    `store_problem` is the store's last probe ("" while it answers: StoreHealth.problem);
    `streams` counts the agents' streams this fleet holds (None: the controller's links)."""
    registry.register(FleetCollector(controller, clock, leadership, store_problem, streams))
    controller.rollout_listeners.append(RolloutMetrics(registry))
    controller.rollout_event_listeners.append(CanaryMetrics(registry))
