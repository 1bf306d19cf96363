"""deploy/: each kustomize overlay renders, every object it renders is valid for the pinned
Kubernetes version (the ServiceMonitor CRD against the schema we keep for it), the Dockerfile
passes hadolint, and the manifests say what docs/deploy.md promises of them."""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleet_svc.__main__ import build_parser as fleet_parser
from fleet_svc.agent.__main__ import build_parser as agent_parser
from fleet_svc.agent.config_file import load_config
from fleet_svc.domain.access import Role
from fleet_svc.rpc.settings import read_roles
from planner_svc.__main__ import build_parser as planner_parser

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "prod")
KUBERNETES_VERSION = "1.32.0"
"""The Kubernetes version the manifests are validated against (kubernetes-validate's bundled
schemas, offline): 1.32 is the oldest minor still in the upstream support window when these
manifests were written."""
OLDEST_VERSION = "1.27.0"
"""The oldest version docs/deploy.md says the manifests run on (gRPC probes are GA there)."""
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.json",
}
"""Custom resources kubernetes-validate has no schema for, and the schema each is checked
against instead (deploy/kubernetes/schemas). A kind missing from both fails the test."""
OPERATOR_SECRETS = {
    "llmgw-planner-tls",
    "llmgw-fleet-tls",
    "llmgw-fleet-planner-client",
    "llmgw-node-certs",
    "llmgw-fleet-store",
}
"""Secrets the operator creates before applying (docs/deploy.md, "Secrets"); every other
Secret or ConfigMap a pod names must be rendered by the overlay itself."""
PARSERS = {
    "planner_svc": planner_parser,
    "fleet_svc": fleet_parser,
    "fleet_svc.agent": agent_parser,
}


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (see the Makefile)")
    return found


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize` renders for an overlay."""
    out = subprocess.run(
        [_tool("kubectl"), "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize {overlay} failed: {out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def of_kind(overlay: str, kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [o for o in rendered(overlay) if o["kind"] == kind]


def named(overlay: str, kind: str, name: str) -> dict[str, Any]:
    """The rendered object of a kind and name."""
    (found,) = [o for o in of_kind(overlay, kind) if o["metadata"]["name"] == name]
    return found


def workloads(overlay: str) -> Iterator[dict[str, Any]]:
    """Every Deployment, DaemonSet and StatefulSet rendered."""
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        yield from of_kind(overlay, kind)


def ours(overlay: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container that runs llmgw's image."""
    for w in workloads(overlay):
        for c in w["spec"]["template"]["spec"]["containers"]:
            if "llmgw" in c["image"] or "control-plane" in c["image"]:
                yield w, c


def validate(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> None:
    """Validate one object: a built-in kind strictly against `version`'s schema, a custom
    resource against ours. Raises on anything invalid or unknown."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRD_SCHEMAS:
        schema = json.loads((KUBERNETES / "schemas" / CRD_SCHEMAS[key]).read_text())
        jsonschema.validate(obj, schema)
        return
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, OLDEST_VERSION])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates(overlay: str, version: str) -> None:
    """Every object an overlay renders is valid for the pinned Kubernetes version and the
    oldest the docs promise (a custom resource: for the schema kept beside the manifests)."""
    objects = rendered(overlay)
    assert len(objects) > 10
    for obj in objects:
        try:
            validate(obj, version)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(
                f"{obj['kind']} ({obj['apiVersion']}) has no schema: add one to CRD_SCHEMAS"
            )
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {exc}")


def test_validation_refuses_a_misspelt_field() -> None:
    """The checks can fail: a misspelt field in a Deployment and in the ServiceMonitor is
    refused, and a CRD with no schema is not waved through."""
    deployment = copy.deepcopy(named("prod", "Deployment", "llmgw-planner"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(named("prod", "ServiceMonitor", "llmgw"))
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    unknown = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "x"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate(unknown)


def test_dockerfile_passes_hadolint() -> None:
    """deploy/Dockerfile has no hadolint finding at any level (style included)."""
    out = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "style", str(ROOT / "deploy" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_is_multi_stage_pinned_and_unprivileged() -> None:
    """The image is built in stages from a base pinned to an exact tag, and runs as a numeric
    non-root user (what the manifests' runAsUser names)."""
    lines = (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
    bases = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert len(bases) >= 2
    for base in bases:
        _, _, tag = base.partition(":")
        assert "@sha256:" in base or (tag and tag != "latest" and tag[0].isdigit()), base
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert user.split(":")[0] == "10001"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_unprivileged_with_requests(overlay: str) -> None:
    """Every container runs as non-root on a read-only root filesystem, without privilege
    escalation or capabilities, and asks for CPU and memory."""
    containers = [
        (w, c) for w in workloads(overlay) for c in w["spec"]["template"]["spec"]["containers"]
    ]
    assert len(containers) >= 3
    for w, c in containers:
        where = f"{w['metadata']['name']}/{c['name']}"
        pod = w["spec"]["template"]["spec"]
        sc = c["securityContext"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] > 0, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["capabilities"]["drop"] == ["ALL"], where
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_flag_parses_and_every_module_exists(overlay: str) -> None:
    """The arguments each container passes are accepted by the command it runs (the real
    argument parsers), and its ports are the ones those flags name."""
    seen = set()
    for w, c in ours(overlay):
        module, *flags = c["args"]
        seen.add(module)
        assert importlib.util.find_spec(module) is not None, module
        opts = PARSERS[module]().parse_args(flags)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert opts.probe_listen.endswith(f":{ports['probes']}"), w["metadata"]["name"]
        assert opts.metrics.endswith(f":{ports['metrics']}"), w["metadata"]["name"]
        if module != "fleet_svc.agent":
            assert opts.listen.endswith(f":{ports['grpc']}"), w["metadata"]["name"]
            assert opts.tls_ca and opts.tls_cert and opts.tls_key  # mutual TLS
    assert seen == set(PARSERS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_are_grpc_on_the_probe_port(overlay: str) -> None:
    """Liveness and readiness are Kubernetes' own gRPC probes on the plaintext probe port:
    liveness asks `llmgw.liveness` (a store outage restarts nothing), readiness the server."""
    for w, c in ours(overlay):
        probes = c["ports"][[p["name"] for p in c["ports"]].index("probes")]["containerPort"]
        assert c["livenessProbe"]["grpc"] == {"port": probes, "service": "llmgw.liveness"}
        assert c["readinessProbe"]["grpc"] == {"port": probes}, w["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fleet_is_several_with_its_dsn_from_a_secret(overlay: str) -> None:
    """Two or more fleets share one PostgreSQL, whose DSN reaches them from a Secret (never a
    flag in the manifest), and a PodDisruptionBudget keeps one standing."""
    fleet = named(overlay, "Deployment", "llmgw-fleet")
    assert fleet["spec"]["replicas"] >= 2
    (c,) = fleet["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--store") for a in c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert "secretKeyRef" in env["LLMGW_FLEET_STORE"]["valueFrom"]
    pdb = named(overlay, "PodDisruptionBudget", "llmgw-fleet")
    assert pdb["spec"]["minAvailable"] >= 1
    if overlay == "dev":
        (secret,) = [
            s
            for s in of_kind("dev", "Secret")
            if s["metadata"]["name"].startswith("llmgw-fleet-store")
        ]
        assert (
            env["LLMGW_FLEET_STORE"]["valueFrom"]["secretKeyRef"]["name"]
            == secret["metadata"]["name"]
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_planner_scales_and_survives_disruptions(overlay: str) -> None:
    """The planner is a Deployment behind a Service, scaled by an HPA on CPU, with a PDB."""
    planner = named(overlay, "Deployment", "llmgw-planner")
    hpa = named(overlay, "HorizontalPodAutoscaler", "llmgw-planner")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "llmgw-planner"
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"] >= 1
    assert planner["spec"]["replicas"] >= hpa["spec"]["minReplicas"]
    assert (
        named(overlay, "PodDisruptionBudget", "llmgw-planner")["spec"]["selector"]
        == planner["spec"]["selector"]
    )
    if overlay == "prod":
        assert hpa["spec"]["minReplicas"] >= 2


def test_prod_agent_runs_on_gpu_nodes_with_its_cards() -> None:
    """In production the agent is a DaemonSet on GPU nodes: the NVIDIA runtime class, a node
    selector, the cards claimed from the device plugin, and its node's own certificate."""
    agent = named("prod", "DaemonSet", "llmgw-agent")
    pod = agent["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    (c,) = pod["containers"]
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == int(
        pod["nodeSelector"]["nvidia.com/gpu.count"]
    )
    assert "--tls-cert=/etc/llmgw/node-certs/node-$(NODE_NAME).crt" in c["args"]
    assert {"NODE_NAME", "POD_IP"} <= {e["name"] for e in c["env"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["node-certs"]["secret"]["secretName"] == "llmgw-node-certs"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_agents_gateway_and_fleets_reach_the_fleet(overlay: str) -> None:
    """The namespace denies ingress by default; the fleet's gRPC port admits agents, the
    gateway and other fleets only, its other ports just metrics and probes."""
    deny = named(overlay, "NetworkPolicy", "llmgw-default-deny")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    policy = named(overlay, "NetworkPolicy", "llmgw-fleet")
    grpc_rules = [
        r
        for r in policy["spec"]["ingress"]
        if {"port": "grpc", "protocol": "TCP"} in r.get("ports", [])
    ]
    (rule,) = grpc_rules
    names = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in rule["from"]}
    assert names == {"llmgw-agent", "llmgw-gateway", "llmgw-fleet"}
    for r in policy["spec"]["ingress"]:
        assert r["ports"] and all(p["port"] in ("grpc", "metrics", "probes") for p in r["ports"])
        if "from" not in r:
            assert [p["port"] for p in r["ports"]] == ["probes"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_and_pods_name_what_exists(overlay: str) -> None:
    """Every Service selects some workload's pods, and every ConfigMap or Secret a pod names
    is rendered by the overlay or is one the docs tell the operator to create."""
    labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(overlay)]
    for svc in of_kind(overlay, "Service"):
        selector = svc["spec"]["selector"]
        assert any(selector.items() <= lab.items() for lab in labels), svc["metadata"]["name"]
    made = {
        o["metadata"]["name"] for o in rendered(overlay) if o["kind"] in ("ConfigMap", "Secret")
    }
    for w in workloads(overlay):
        pod = w["spec"]["template"]["spec"]
        names = [v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v]
        names += [v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v]
        names += [
            e["valueFrom"]["secretKeyRef"]["name"]
            for c in pod["containers"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        ]
        for name in names:
            assert name in made or name in OPERATOR_SECRETS, f"{w['metadata']['name']}: {name}"


def test_service_monitor_scrapes_every_service() -> None:
    """The ServiceMonitor selects the planner's, the fleet's and the agents' metrics Services
    by one label, on their `metrics` port; the dev overlay leaves it out (no CRD there)."""
    monitor = named("prod", "ServiceMonitor", "llmgw")
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = [
        s for s in of_kind("prod", "Service") if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["name"] for s in scraped} == {
        "llmgw-planner",
        "llmgw-fleet",
        "llmgw-agent-metrics",
    }
    for svc in scraped:
        assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert of_kind("dev", "ServiceMonitor") == []
    assert of_kind("dev", "PrometheusRule") == []
    assert [r["metadata"]["name"] for r in of_kind("prod", "PrometheusRule")] == ["llmgw"]


def test_config_files_in_the_manifests_load(tmp_path: Path) -> None:
    """The agent config and the fleet settings the ConfigMaps carry are read by the agent and
    the fleet without complaint."""
    (agent_cm,) = [
        c
        for c in of_kind("prod", "ConfigMap")
        if c["metadata"]["name"].startswith("llmgw-agent-config")
    ]
    (settings_cm,) = [
        c
        for c in of_kind("prod", "ConfigMap")
        if c["metadata"]["name"].startswith("llmgw-fleet-settings")
    ]
    agent_file = tmp_path / "agent.yaml"
    agent_file.write_text(agent_cm["data"]["agent.yaml"])
    config = load_config(agent_file)
    assert {"vllm", "llamacpp", "standin"} <= set(config.engines)
    assert config.engine_host == "0.0.0.0"
    settings = tmp_path / "settings.yaml"
    settings.write_text(settings_cm["data"]["settings.yaml"])
    roles = read_roles(settings)
    assert roles.role_of("admin") is Role.ADMIN
    assert roles.may_act_for_others("gateway")
