"""Leadership on a leased store, and clients finding the leader: fleet_svc.leadership and
llmgw.clients.leader on plain values (the lease itself is tested on PostgreSQL in
tests/integration/test_store_lease.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from fleet_svc.leadership import NO_EPOCH, Following, Leadership
from fleet_svc.store.base import NotLeader, StoreUnavailable
from fleet_svc.store.postgres_lease import Lease
from llmgw.clients.errors import Refused, Unreachable
from llmgw.clients.leader import Fleets, fleet_addresses, leader_hint


@dataclass
class Clock:
    """Seconds, moved by the test."""

    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class LeaseTable:
    """The lease row's rules (postgres_lease._ACQUIRE) on a clock the test moves: shared by
    the fake stores of several fleets, as one database is."""

    clock: Clock
    holder: str = ""
    address: str = ""
    epoch: int = 0
    expires: float = 0.0
    down: bool = False

    def acquire(self, holder: str, address: str, lease_s: float) -> Lease:
        if self.down:
            raise StoreUnavailable("db", "connection refused")
        now = self.clock()
        if self.holder == holder or self.expires <= now or not self.holder:
            if not (self.holder == holder and self.expires > now):
                self.epoch += 1
            self.holder, self.address, self.expires = holder, address, now + lease_s
            return Lease(holder, address, self.epoch, True)
        return Lease(self.holder, self.address, self.epoch, False)


@dataclass
class FakeLeasedStore:
    """One fleet's view of the lease table, remembering the fences it was given."""

    table: LeaseTable
    where: str = "postgresql://db"
    fences: list[int | None] = field(default_factory=list)

    def acquire_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        return self.table.acquire(holder, address, lease_s)

    def release_lease(self, holder: str) -> None:
        if self.table.holder == holder:
            self.table.expires = self.table.clock()

    def fence(self, epoch: int | None) -> None:
        self.fences.append(epoch)

    def state_digest(self) -> str:
        return ""

    def listen(self, changed: Callable[[str], None], stop: threading.Event) -> None:
        stop.wait()


def fleet(table: LeaseTable, name: str) -> tuple[Leadership, FakeLeasedStore, list[str]]:
    """A fleet's Leadership on the table, and the events its callbacks saw."""
    store = FakeLeasedStore(table)
    seen: list[str] = []
    lead = Leadership(
        store, f"{name}:1", holder=name, lease_s=6.0, renew_s=2.0, monotonic=table.clock
    )
    lead.on_elected = lambda epoch: seen.append(f"elected {epoch}")
    lead.on_deposed = lambda why: seen.append("deposed")
    return lead, store, seen


async def test_the_first_fleet_leads_fenced_and_the_second_follows_naming_it() -> None:
    """The first attempt of a lone fleet leads at epoch 1 with the store fenced at it; the
    second fleet follows, its store fenced at NO_EPOCH, and its refusal names the leader."""
    table = LeaseTable(Clock())
    a, a_store, a_seen = fleet(table, "a")
    b, b_store, b_seen = fleet(table, "b")
    await a.attempt()
    await b.attempt()
    assert (a.is_leader, a.epoch, a_seen, a_store.fences) == (True, 1, ["elected 1"], [0, 1])
    assert (b.is_leader, b_seen, b_store.fences) == (False, [], [NO_EPOCH])
    assert a.refusal() is None
    refused = b.refusal()
    assert isinstance(refused, Following) and isinstance(refused, NotLeader)
    assert (refused.leader, refused.leader_address) == ("a", "a:1")
    assert "a at a:1 leads" in str(refused)


async def test_a_leader_that_cannot_renew_stops_leading_when_its_lease_runs_out() -> None:
    """With the store down, the leader still leads until LEASE_S after its last successful
    ask, then is_leader turns False by itself and the next attempt deposes it."""
    table = LeaseTable(Clock())
    a, a_store, seen = fleet(table, "a")
    await a.attempt()
    table.down = True
    table.clock.now += 5.9
    await a.attempt()
    assert a.is_leader and seen == ["elected 1"]
    table.clock.now += 0.2
    assert not a.is_leader  # before any attempt: a paused leader resumes not leading
    await a.attempt()
    assert seen == ["elected 1", "deposed"] and a.epoch == NO_EPOCH
    assert a_store.fences[-1] == NO_EPOCH


async def test_a_takeover_deposes_the_old_leader_and_a_late_renewal_starts_a_new_epoch() -> None:
    """Past its lease, b takes over at epoch 2 and a's next attempt deposes it; and a leader
    renewing only after its own lease ran out (nobody took it) is deposed and elected again at
    a new epoch, so nothing it held under the old one is trusted."""
    table = LeaseTable(Clock())
    a, _a_store, a_seen = fleet(table, "a")
    b, _b_store, b_seen = fleet(table, "b")
    await a.attempt()
    table.clock.now += 7
    await b.attempt()
    await a.attempt()
    assert (b.epoch, b_seen) == (2, ["elected 2"])
    assert a_seen == ["elected 1", "deposed"] and a.leader_address == "b:1"
    table.clock.now += 7
    await b.attempt()
    assert b_seen == ["elected 2", "deposed", "elected 3"] and b.epoch == 3


async def test_a_write_meeting_the_fence_deposes_at_once() -> None:
    """NotLeader from a write ends leadership before the next attempt, naming the leader."""
    table = LeaseTable(Clock())
    a, _store, seen = fleet(table, "a")
    await a.attempt()
    a.deposed(NotLeader("db", 1, leader_epoch=2, leader="b", leader_address="b:1"))
    assert not a.is_leader and seen == ["elected 1", "deposed"]
    refused = a.refusal()
    assert refused is not None and refused.leader_address == "b:1"


def test_a_renewal_must_come_within_the_lease() -> None:
    """A renewal period as long as the lease is refused: the lease would run out between."""
    with pytest.raises(ValueError, match="renew sooner"):
        Leadership(FakeLeasedStore(LeaseTable(Clock())), "a:1", lease_s=2.0, renew_s=2.0)


@pytest.mark.parametrize(
    ("spec", "resolved", "expected"),
    [
        ("a:1", [], ("a:1",)),
        ("a:1, b:2 ,a:1", [], ("a:1", "b:2")),
        ("10.0.0.1:50052", ["unused"], ("10.0.0.1:50052",)),
        ("fleet:50052", ["10.0.0.1"], ("fleet:50052",)),
        ("fleet:50052", ["10.0.0.1", "10.0.0.2"], ("10.0.0.1:50052", "10.0.0.2:50052")),
        ("fleet:50052", ["fd00::1", "fd00::2"], ("[fd00::1]:50052", "[fd00::2]:50052")),
    ],
)
def test_fleet_addresses_from_a_list_or_a_name_resolving_to_several(
    spec: str, resolved: Sequence[str], expected: tuple[str, ...]
) -> None:
    """Comma-separated addresses are kept in order once each; a lone name resolving to
    several addresses (a headless Service) stands for each; one address or an IP stays."""
    assert fleet_addresses(spec, lambda host, port: resolved) == expected


@pytest.mark.parametrize("spec", ["", " , ", "host", "a:1,b", "a:port"])
def test_fleet_addresses_refuse_what_is_not_host_port(spec: str) -> None:
    """Nothing, or an entry without a numeric port, is refused saying what is expected."""
    with pytest.raises(ValueError, match="HOST:PORT"):
        fleet_addresses(spec, lambda host, port: [])


def not_leader(address: str) -> Unreachable:
    """A follower's answer, naming the leader at `address` ("" during an election)."""
    return Unreachable(
        address="x",
        detail="this fleet does not lead",
        service="fleet",
        reason="NOT_LEADER",
        metadata={"leader_address": address},
    )


def test_fleets_go_to_the_named_leader_else_to_the_next_in_turn() -> None:
    """NOT_LEADER naming a leader moves there at once (learning it if new); an election
    (no name) or a fleet that does not answer moves to the next address in turn."""
    fleets = Fleets(["a:1", "b:1"])
    assert fleets.after(not_leader("b:1")) is True and fleets.current == "b:1"
    assert fleets.after(not_leader("")) is False and fleets.current == "a:1"
    assert fleets.after(Unreachable(address="a:1", detail="refused")) is False
    assert fleets.current == "b:1"
    assert fleets.after(not_leader("c:1")) is True
    assert (fleets.current, fleets.addresses) == ("c:1", ["a:1", "b:1", "c:1"])
    assert fleets.after(not_leader("c:1")) is False and fleets.current == "a:1"


def test_only_not_leader_names_a_leader() -> None:
    """A refusal or another UNAVAILABLE carries no leader hint, whatever its metadata."""
    refused = Refused("NOT_LEADER", "no", {"leader_address": "b:1"}, "FAILED_PRECONDITION")
    other = Unreachable(address="a", detail="d", reason="STORE_UNAVAILABLE", metadata={})
    assert leader_hint(refused) == "" and leader_hint(other) == ""
    assert leader_hint(not_leader("b:1")) == "b:1"


async def test_a_takeover_that_cannot_load_the_state_leads_at_the_next_attempt() -> None:
    """When taking over fails on the store (the state does not load), the fleet does not lead
    meanwhile and is elected again at its next attempt, keeping the lease it holds."""
    table = LeaseTable(Clock())
    a, _store, seen = fleet(table, "a")
    fail = [True]

    def elected(epoch: int) -> None:
        if fail.pop():
            raise StoreUnavailable("db", "connection reset")
        seen.append(f"elected {epoch}")

    a.on_elected = elected
    await a.attempt()
    assert not a.is_leader and seen == ["deposed"]
    fail.append(False)
    table.clock.now += 2
    await a.attempt()
    assert a.is_leader and seen == ["deposed", "elected 1"]
