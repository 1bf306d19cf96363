"""What gRPC callers rely on besides the reasons: RetryInfo on every UNAVAILABLE and
RESOURCE_EXHAUSTED the services answer, a published service config that names every unary
method under the right retry rule, and the Go client's typed reasons matching docs/errors.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
from google.protobuf import descriptor as pb_descriptor
from google.rpc import error_details_pb2, status_pb2

import fleet_svc.server  # noqa: F401  (loads every fleet refusal class)
import planner_svc.server  # noqa: F401  (loads every planner refusal class)
from fleet_svc.rpc import status as fleet_status
from fleet_svc.store.base import NotLeader
from llmgw.clients import service_config
from llmgw.fleet.v1 import fleet_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc import intake
from planner_svc.rpc import status as planner_status
from tests.unit.test_errors_doc import documented

ROOT = Path(__file__).resolve().parents[2]
RETRIED = {grpc.StatusCode.UNAVAILABLE.value[0], grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]}


def retry_info(status: status_pb2.Status) -> error_details_pb2.RetryInfo | None:
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info
    return None


def every_status() -> list[status_pb2.Status]:
    return [
        *planner_status.example_statuses(),
        *fleet_status.example_statuses(),
        *intake.example_statuses("fleet.llmgw.dev"),
    ]


def test_every_unavailable_and_resource_exhausted_carries_retry_info() -> None:
    """RetryInfo exactly on the retried codes, never a negative delay."""
    statuses = every_status()
    assert {s.code for s in statuses} >= RETRIED
    for status in statuses:
        info = retry_info(status)
        if status.code in RETRIED:
            assert info is not None, status.message
            assert info.retry_delay.ToNanoseconds() >= 0, status.message
        else:
            assert info is None, status.message


def test_not_leader_naming_the_leader_may_be_retried_there_at_once() -> None:
    """Named, the leader answers now (0 s); during an election, the default delay."""
    named = fleet_status.store_status(
        NotLeader("db", 1, leader_epoch=2, leader="b", leader_address="10.0.0.2:1")
    )
    election = fleet_status.store_status(
        NotLeader("db", 1, leader_epoch=2, leader="", leader_address="")
    )
    assert named is not None and election is not None
    assert retry_info(named).retry_delay.ToNanoseconds() == 0  # type: ignore[union-attr]
    assert retry_info(election).retry_delay.ToNanoseconds() > 0  # type: ignore[union-attr]


def unary_methods(service: pb_descriptor.ServiceDescriptor) -> dict[str, bool]:
    """Unary method name -> whether its request carries a request_id (a fleet write)."""
    return {
        m.name: "request_id" in m.input_type.fields_by_name
        for m in service.methods
        if not m.client_streaming and not m.server_streaming
    }


def test_service_config_names_every_unary_method_under_its_rule() -> None:
    """Reads under one policy, writes (each carrying a request id) under the other; no stream
    (a watch is resumed by its caller, not replayed by gRPC); round_robin; the Go copy is the
    same bytes."""
    config = json.loads(service_config.SERVICE_CONFIG)
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    fleet = fleet_pb2.DESCRIPTOR.services_by_name["FleetService"]
    planner = planner_pb2.DESCRIPTOR.services_by_name["PlannerService"]
    methods = {f"{fleet.full_name}/{n}": w for n, w in unary_methods(fleet).items()}
    methods |= {f"{planner.full_name}/{n}": w for n, w in unary_methods(planner).items()}
    assert not any(methods[m] for m in methods if m.startswith(planner.full_name))
    reads, writes = config["methodConfig"]
    for section, want_write in ((reads, False), (writes, True)):
        policy = section["retryPolicy"]
        assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
        assert 2 <= policy["maxAttempts"] <= 5
        for name in section["name"]:
            named = [m for m in methods if m == f"{name['service']}/{name.get('method', '')}"]
            named = named or [m for m in methods if m.startswith(name["service"] + "/")]
            assert named, f"the service config names no method of the protos: {name}"
            for m in named:
                assert methods.pop(m) is want_write, m
    assert not methods, f"unary methods the service config does not name: {sorted(methods)}"
    # The Python clients' channels: the load balancing, not the retry policies (they run
    # those themselves, llmgw.clients.errors.call).
    (name, channel_config), *_ = service_config.CHANNEL_OPTIONS
    assert name == "grpc.service_config"
    assert json.loads(channel_config)["loadBalancingConfig"] == config["loadBalancingConfig"]
    assert "retryPolicy" not in channel_config
    go_copy = ROOT / "gen" / "go" / "client" / "service_config.json"
    assert go_copy.read_bytes() == service_config.SERVICE_CONFIG.encode()


def test_the_go_client_types_every_documented_reason() -> None:
    """gen/go/client/errors.go declares a Reason constant for each reason docs/errors.md lists
    (which test_errors_doc checks against the services' tables), and no other."""
    source = (ROOT / "gen" / "go" / "client" / "errors.go").read_text()
    declared = set(re.findall(r'^\s+Reason\w+\s+Reason = "([A-Z_]+)"', source, re.MULTILINE))
    want = {reason for section in documented().values() for reason in section}
    assert declared == want, (sorted(want - declared), sorted(declared - want))
