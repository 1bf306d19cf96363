"""deploy/'s alerts and dashboard: the PrometheusRule's rules pass `promtool check rules` and
its unit tests (`promtool test rules`, deploy/monitoring/rules.test.yaml); every series the
rules and the Grafana dashboard name is one a real fleet, planner or agent exports; the
committed dashboard is the one scripts/gen_dashboard.py writes."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet_svc.agent.metrics import AgentCollector
from llmgw.metrics import add_standard_collectors
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

ROOT = Path(__file__).resolve().parents[2]
RULE = ROOT / "deploy" / "kubernetes" / "base" / "prometheus-rule.yaml"
RULE_TESTS = ROOT / "deploy" / "monitoring" / "rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "kubernetes" / "base" / "grafana-dashboard.json"
SERIES = re.compile(r"\b((?:llmgw|grpc_server|process|python)_[a-z0-9_]+)\b")
ALERTS = {
    "LlmgwFleetLeaderLost",
    "LlmgwFleetLeadersSplit",
    "LlmgwRolloutStuck",
    "LlmgwAgentsNotHeard",
    "LlmgwNodesLost",
    "LlmgwStoreUnavailable",
    "LlmgwWatchersCut",
}
"""The alerts docs/deploy.md lists (leader lost, a rollout stuck, agents not heard, the store
unavailable, watchers cut for being slow, and their companions)."""


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: `make promtool` installs Debian's prometheus")
    return found


def _rules() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(RULE.read_text())["spec"]
    return spec


def test_promtool_checks_and_tests_the_rules(tmp_path: Path) -> None:
    """The rule file promtool reads is the PrometheusRule's spec; it checks clean, and every
    alert's unit test passes; each alert listed is defined and tested."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules()))
    shutil.copy(RULE_TESTS, tmp_path / "rules.test.yaml")
    for args in (["check", "rules", "rules.yaml"], ["test", "rules", "rules.test.yaml"]):
        done = subprocess.run(
            [promtool(), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
    defined = {r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    assert defined == ALERTS
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
    }
    assert tested == ALERTS


def test_promtool_tests_can_fail(tmp_path: Path) -> None:
    """A unit test expecting the wrong labels fails: the passing run above means something."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rules()))
    wrong = RULE_TESTS.read_text().replace("namespace: busy}", "namespace: elsewhere}")
    (tmp_path / "rules.test.yaml").write_text(wrong)
    done = subprocess.run(
        [promtool(), "test", "rules", "rules.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


class _Connected:
    def __init__(self) -> None:
        self.connected = asyncio.Event()


class _NoReplicas:
    card_indices: tuple[int, ...] = ()

    def observed(self) -> list[Any]:
        return []


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}
"""The sample names a family of each type has (a labelled family with no child yet has its
HELP and TYPE lines, but no samples)."""


def _names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


async def _exported(data: Path) -> set[str]:
    """Every sample name a real fleet's and planner's /metrics serve, and the agent's
    collector."""
    names: set[str] = set()
    async with (
        running_fleet(data, metrics="127.0.0.1:0") as (f, _s),
        running_planner(metrics="127.0.0.1:0") as (p, _ps, _ch),
    ):
        assert f.metrics is not None and p.metrics is not None
        async with httpx.AsyncClient() as client:
            for port in (f.metrics.port, p.metrics.port):
                answer = await client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                names |= _names(answer.text)
    agent = CollectorRegistry()
    agent.register(AgentCollector(_Connected(), _NoReplicas()))  # type: ignore[arg-type]
    add_standard_collectors(agent)
    names |= _names(generate_latest(agent).decode())
    return names


async def test_rules_and_dashboard_name_only_exported_series(tmp_path: Path) -> None:
    """Every series an alert or a dashboard panel reads is exported by llmgw's processes
    (a renamed metric breaks this test, not an alert in production)."""
    exported = await _exported(tmp_path)
    exprs = [r["expr"] for g in _rules()["groups"] for r in g["rules"]]
    board = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in SERIES.findall(str(e))}
    assert "llmgw_fleet_store_up" in used and "grpc_server_handled_total" in used
    assert used <= exported, sorted(used - exported)


def test_dashboard_is_the_generated_one() -> None:
    """deploy/kubernetes/base/grafana-dashboard.json is what scripts/gen_dashboard.py writes;
    each panel has a query and a unique id."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in board["panels"])
