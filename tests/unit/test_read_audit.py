"""The audit of reads (fleet_svc.rpc.reads): every kind of read is seen, repeats are counted,
and neither the table nor the log grows with the call rate."""

from __future__ import annotations

from structlog.testing import capture_logs

from fleet_svc.domain.access import FLEET, Caller
from fleet_svc.rpc.reads import ReadAudit
from llmgw.testing.clock import FakeClock

ALICE = Caller("user", "alice", "certificate")
BOB = Caller("user", "bob", "token")


def test_first_read_of_a_kind_is_logged_and_repeats_are_counted() -> None:
    """alice's first GetModel is logged with who and which model; her next 99 are one
    `audit_read_repeated` with count 99 once the window ends."""
    clock = FakeClock()
    audit = ReadAudit(window_s=60, clock=clock.monotonic)
    with capture_logs() as logs:
        for _ in range(100):
            audit.record(FLEET + "GetModel", ALICE, "llama", "OK")
        audit.record(FLEET + "ListModels", BOB, "", "OK")
        clock.advance(61)
        audit.record(FLEET + "ListModels", BOB, "", "OK")
    firsts = [e for e in logs if e["event"] == "audit_read"]
    assert [(e["identity"], e["rpc"], e["model"]) for e in firsts] == [
        ("user:alice", "GetModel", "llama"),
        ("user:bob", "ListModels", ""),
        ("user:bob", "ListModels", ""),
    ]
    repeated = [e for e in logs if e["event"] == "audit_read_repeated"]
    assert [(e["identity"], e["count"]) for e in repeated] == [("user:alice", 99)]


def test_a_flood_of_distinct_reads_stays_bounded() -> None:
    """10,000 reads of distinct models keep at most max_kinds kinds and write at most
    max_kinds first lines plus one overflow line with the rest counted."""
    clock = FakeClock()
    audit = ReadAudit(window_s=60, max_kinds=50, clock=clock.monotonic)
    with capture_logs() as logs:
        for i in range(10_000):
            audit.record(FLEET + "GetModel", ALICE, f"m{i}", "NOT_FOUND")
        assert audit.kinds == 50
        audit.flush()
    assert sum(1 for e in logs if e["event"] == "audit_read") == 50
    overflow = [e for e in logs if e["event"] == "audit_read_overflow"]
    assert [e["count"] for e in overflow] == [9_950]
    assert audit.kinds == 0
