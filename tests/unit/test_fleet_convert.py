"""The fleet's edge conversions that retries and rollout watchers rely on: a request's
fingerprint, and stored rollout events as enum-typed messages."""

from __future__ import annotations

import pytest

from fleet_svc.rpc.convert import fingerprint, rollout_event
from fleet_svc.store.base import EventRecord
from fleet_svc.store.rows import load_event
from llmgw.fleet.v1 import fleet_pb2


def test_a_fingerprint_ignores_the_request_id_and_the_encoding() -> None:
    """The same request under another id, or with a default written out on the wire, has one
    fingerprint; another body has another."""
    a = fleet_pb2.SetGPUsRequest(name="m", gpus=2, request_id="r1")
    b = fleet_pb2.SetGPUsRequest(name="m", gpus=2, request_id="r2")
    # `profile` "" written explicitly: a field a proto3 encoder leaves out (tag 3, length 0).
    explicit = fleet_pb2.SetGPUsRequest.FromString(b.SerializeToString() + b"\x1a\x00")
    other = fleet_pb2.SetGPUsRequest(name="m", gpus=1, request_id="r1")
    assert fingerprint(a) == fingerprint(b) == fingerprint(explicit)
    assert fingerprint(a) != fingerprint(other)
    assert len(fingerprint(a)) == 64


@pytest.mark.parametrize(
    ("stored", "kind", "mode", "state"),
    [
        (
            {"kind": "replica_stopped", "mode": "beside", "state": "RUNNING"},
            fleet_pb2.ROLLOUT_EVENT_KIND_REPLICA_STOPPED,
            fleet_pb2.ROLLOUT_MODE_BESIDE,
            fleet_pb2.ROLLOUT_STATE_RUNNING,
        ),
        (
            {"kind": "rollout_failed", "mode": "", "state": "FAILED"},
            fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_FAILED,
            fleet_pb2.ROLLOUT_MODE_UNSPECIFIED,
            fleet_pb2.ROLLOUT_STATE_FAILED,
        ),
        (
            {"kind": "from_a_newer_fleet", "mode": "sideways"},
            fleet_pb2.ROLLOUT_EVENT_KIND_UNSPECIFIED,
            fleet_pb2.ROLLOUT_MODE_UNSPECIFIED,
            fleet_pb2.ROLLOUT_STATE_RUNNING,
        ),
    ],
)
def test_a_stored_event_is_sent_with_enum_kind_and_mode(
    stored: dict[str, str], kind: int, mode: int, state: int
) -> None:
    """Events as the store keeps them (lower-case strings) are read as typed events and go out
    as enums; a kind or mode this fleet does not know goes out unspecified, not as an error."""
    ev = rollout_event(load_event(EventRecord("ro-1", 3, 1.5, {**stored, "replica_id": "r1"})))
    assert (ev.kind, ev.mode, ev.state) == (kind, mode, state)
    assert (ev.rollout_id, ev.seq, ev.replica_id) == ("ro-1", 3, "r1")
