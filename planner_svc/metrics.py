"""The planner's own metrics: its shape cache's hits, misses, fetches and failed fetches,
read from the resolver's counters at every scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from planner_svc.rpc.servicer import Resolver


class PlannerCollector(Collector):
    """`llmgw_planner_shape_cache_{hits,misses}_total`, `llmgw_planner_shape_fetches_total`
    and `llmgw_planner_shape_fetch_errors_total`, from `resolver.stats` (a resolver without
    counters, as tests may give, reports none)."""

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = getattr(self._resolver, "stats", None)
        if stats is None:
            return
        for name, doc, value in (
            ("llmgw_planner_shape_cache_hits", "Shapes answered from the cache.", stats.hits),
            (
                "llmgw_planner_shape_cache_misses",
                "Shape requests the cache could not answer.",
                stats.misses,
            ),
            ("llmgw_planner_shape_fetches", "Shape fetches started.", stats.fetches),
            ("llmgw_planner_shape_fetch_errors", "Shape fetches that failed.", stats.errors),
        ):
            yield CounterMetricFamily(name, doc, value=value)


def add_planner_metrics(registry: CollectorRegistry, resolver: Resolver) -> None:
    """Put the planner's collector in `registry` (the RPC series are the server
    interceptor's, llmgw.metrics.RpcMetrics)."""
    registry.register(PlannerCollector(resolver))
