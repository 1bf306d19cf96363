"""The fleet's HTTP rules (google.api.http): every RPC has one, on the gateway's paths, and
docs/rest.md lists exactly them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.api import annotations_pb2, http_pb2

from llmgw.fleet.v1 import fleet_pb2

SERVICE = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"]
DOC = Path(__file__).resolve().parents[2] / "docs" / "rest.md"

# RPC -> (method, path, body) of its rule and its additional bindings.
RULES: dict[str, list[tuple[str, str, str]]] = {
    "ListModels": [("get", "/api/v1/models", "")],
    "CreateModel": [("post", "/api/v1/models", "model")],
    "GetModel": [("get", "/api/v1/models/{name}", "")],
    "UpdateModel": [("patch", "/api/v1/models/{model.name}", "model")],
    "DeleteModel": [("delete", "/api/v1/models/{name}", "")],
    "ListModelRevisions": [("get", "/api/v1/models/{name}/revisions", "")],
    "SetContext": [("post", "/api/v1/models/{name}/context", "*")],
    "SetGPUs": [("post", "/api/v1/models/{name}/gpus", "*")],
    "ListNodes": [("get", "/api/v1/nodes", "")],
    "ListReplicas": [
        ("get", "/api/v1/replicas", ""),
        ("get", "/api/v1/models/{model}/replicas", ""),
    ],
    "WatchReplicas": [
        ("get", "/api/v1/replicas:watch", ""),
        ("get", "/api/v1/models/{model}/replicas:watch", ""),
    ],
    "ListRollouts": [
        ("get", "/api/v1/rollouts", ""),
        ("get", "/api/v1/models/{model}/rollouts", ""),
    ],
    "GetRollout": [("get", "/api/v1/rollouts/{id}", "")],
    "WatchRollout": [("get", "/api/v1/rollouts/{id}:watch", "")],
    "CancelRollout": [("post", "/api/v1/rollouts/{id}:cancel", "*")],
    "UndoRollout": [("post", "/api/v1/rollouts/{id}:undo", "*")],
    "PromoteRollout": [("post", "/api/v1/rollouts/{id}:promote", "*")],
    "ReportTraffic": [("post", "/api/v1/traffic", "*")],
}


def bindings(rule: http_pb2.HttpRule) -> list[tuple[str, str, str]]:
    """A rule and its additional bindings as (method, path, body)."""
    out = []
    for r in (rule, *rule.additional_bindings):
        kind = r.WhichOneof("pattern")
        assert kind is not None and kind != "custom"
        out.append((kind, getattr(r, kind), r.body))
    return out


def rule_of(method: str) -> http_pb2.HttpRule:
    """The HTTP rule on a FleetService method."""
    options = SERVICE.methods_by_name[method].GetOptions()
    assert options.HasExtension(annotations_pb2.http), method
    return options.Extensions[annotations_pb2.http]


def test_every_rpc_has_a_rule() -> None:
    """No FleetService RPC is left without an HTTP rule, and the table names no other."""
    assert {m.name for m in SERVICE.methods} == set(RULES)


@pytest.mark.parametrize("method", sorted(RULES))
def test_each_rule_is_the_gateways_path(method: str) -> None:
    """Each RPC's rule is the gateway's method, path and body."""
    assert bindings(rule_of(method)) == RULES[method]


@pytest.mark.parametrize("method", sorted(RULES))
def test_path_variables_name_request_fields(method: str) -> None:
    """Every {variable} of a path is a field of the request (a dotted path into a message
    field), so a transcoder can bind it."""
    request = SERVICE.methods_by_name[method].input_type
    for _, path, body in bindings(rule_of(method)):
        for variable in re.findall(r"\{([^}=]+)\}", path):
            message = request
            *parents, leaf = variable.split(".")
            for part in parents:
                inner = message.fields_by_name[part].message_type
                assert inner is not None, (method, variable)
                message = inner
            assert leaf in message.fields_by_name, (method, variable)
        assert body in ("", "*") or body in request.fields_by_name, (method, body)


def test_docs_list_exactly_the_rules() -> None:
    """docs/rest.md's table holds every binding, and no other."""
    documented = set(re.findall(r"`(GET|POST|PATCH|DELETE) (/api/v1/[^`]+)`", DOC.read_text()))
    rules = {(m.upper(), p) for rs in RULES.values() for m, p, _ in rs}
    assert documented == rules
