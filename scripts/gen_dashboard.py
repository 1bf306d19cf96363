"""Write deploy/kubernetes/base/grafana-dashboard.json, llmgw's Grafana dashboard, from the
panels listed here (`python scripts/gen_dashboard.py`; `--check` fails when the committed file
differs). The expressions use only series llmgw's processes export
(tests/integration/test_alert_rules.py checks every name against real scrapes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = (
    Path(__file__).resolve().parents[1]
    / "deploy"
    / "kubernetes"
    / "base"
    / "grafana-dashboard.json"
)
NS = 'namespace=~"$namespace"'

# (title, kind, unit, [(expr, legend)]) per panel, in reading order, two a row.
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Fleets leading", "stat", "none", [(f"sum(llmgw_fleet_leader{{{NS}}})", "leaders")]),
    ("Store answering", "stat", "none", [(f"min(llmgw_fleet_store_up{{{NS}}})", "store up")]),
    (
        "Replicas by phase",
        "timeseries",
        "none",
        [(f"sum by (phase) (llmgw_fleet_replicas{{{NS}}})", "{{phase}}")],
    ),
    (
        "Nodes by phase",
        "timeseries",
        "none",
        [(f"max by (phase) (llmgw_fleet_nodes{{{NS}}})", "{{phase}}")],
    ),
    (
        "Agents heard (seconds since)",
        "timeseries",
        "s",
        [(f"max by (node) (llmgw_fleet_agent_heartbeat_lag_seconds{{{NS}}})", "{{node}}")],
    ),
    (
        "Agents connected",
        "timeseries",
        "none",
        [(f"sum(llmgw_fleet_agents_connected{{{NS}}})", "connected")],
    ),
    (
        "Rollouts",
        "timeseries",
        "none",
        [
            (f"max(llmgw_fleet_rollouts_running{{{NS}}})", "running"),
            (
                f"sum by (outcome) (increase(llmgw_fleet_rollouts_total{{{NS}}}[1h]))",
                "ended in the hour: {{outcome}}",
            ),
        ],
    ),
    (
        "Rollout time",
        "timeseries",
        "s",
        [
            (f"max(llmgw_fleet_rollout_oldest_running_seconds{{{NS}}})", "oldest running"),
            (
                "histogram_quantile(0.9, sum by (le) "
                f"(rate(llmgw_fleet_rollout_duration_seconds_bucket{{{NS}}}[1h])))",
                "p90 of those ended",
            ),
        ],
    ),
    (
        "RPCs by method and code",
        "timeseries",
        "reqps",
        [
            (
                "sum by (grpc_service, grpc_method, grpc_code) "
                f"(rate(grpc_server_handled_total{{{NS}}}[5m]))",
                "{{grpc_method}} {{grpc_code}}",
            )
        ],
    ),
    (
        "RPC latency p99",
        "timeseries",
        "s",
        [
            (
                "histogram_quantile(0.99, sum by (le, grpc_method) "
                f"(rate(grpc_server_handling_seconds_bucket{{{NS}}}[5m])))",
                "{{grpc_method}}",
            )
        ],
    ),
    (
        "Endpoint watchers",
        "timeseries",
        "none",
        [
            (f"sum(llmgw_fleet_watchers{{{NS}}})", "open"),
            (f"sum(increase(llmgw_fleet_watchers_cut_total{{{NS}}}[15m]))", "cut in 15 min"),
        ],
    ),
    (
        "Planner shapes",
        "timeseries",
        "ops",
        [
            (f"sum(rate(llmgw_planner_shape_cache_hits_total{{{NS}}}[5m]))", "cache hits"),
            (f"sum(rate(llmgw_planner_shape_cache_misses_total{{{NS}}}[5m]))", "cache misses"),
            (f"sum(rate(llmgw_planner_shape_fetch_errors_total{{{NS}}}[5m]))", "fetch errors"),
        ],
    ),
    (
        "Agents' replicas by phase",
        "timeseries",
        "none",
        [(f"sum by (phase) (llmgw_agent_replicas{{{NS}}})", "{{phase}}")],
    ),
    (
        "Agents' cards",
        "timeseries",
        "none",
        [
            (f"sum(llmgw_agent_cards{{{NS}}})", "cards"),
            (f"sum(llmgw_agent_connected{{{NS}}})", "agents connected"),
        ],
    ),
    (
        "CPU by process",
        "timeseries",
        "percentunit",
        [(f"rate(process_cpu_seconds_total{{{NS}}}[5m])", "{{job}} {{pod}}")],
    ),
    (
        "Memory by process",
        "timeseries",
        "bytes",
        [(f"process_resident_memory_bytes{{{NS}}}", "{{job}} {{pod}}")],
    ),
    (
        "Builds running",
        "table",
        "none",
        [(f"count by (job, version, commit, python) (llmgw_build_info{{{NS}}})", "")],
    ),
]


def panel(i: int, title: str, kind: str, unit: str, targets: list[tuple[str, str]]) -> Any:
    """One panel at its place in a two-column grid."""
    return {
        "id": i + 1,
        "title": title,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {
                "refId": chr(ord("A") + n),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": expr,
                "legendFormat": legend,
                **({"format": "table", "instant": True} if kind == "table" else {}),
            }
            for n, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> Any:
    """The dashboard's JSON model (Grafana's schemaVersion 39)."""
    return {
        "uid": "llmgw-control-plane",
        "title": "llmgw control plane",
        "description": "The fleet, the planner and the node agents: leadership, the store, "
        "replicas, nodes, rollouts, RPCs, watchers and processes.",
        "tags": ["llmgw"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                },
                {
                    "name": "namespace",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(llmgw_build_info, namespace)",
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "label": "Namespace",
                },
            ]
        },
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def main() -> int:
    """Write the dashboard, or with --check compare it with the committed one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when the file differs")
    opts = parser.parse_args()
    text = json.dumps(dashboard(), indent=2) + "\n"
    if opts.check:
        if OUT.read_text() != text:
            print(f"{OUT} differs: run python scripts/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
