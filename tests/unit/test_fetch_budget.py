"""One resolution's fetch budget and the resolutions' concurrency: charges refused past each
limit with the limit named, limits read from the environment, and the resolver refusing a
caller's fetch past its share or the total while letting others and cache hits through."""

from __future__ import annotations

import asyncio

import pytest

from planner_svc.domain.errors import FetchLimitExceeded, ResolutionsBusy
from planner_svc.sources.budget import FetchBudget, FetchLimits, ResolutionGate
from planner_svc.sources.resolver import ShapeResolver
from tests.unit.test_resolver import LLAMA_CONFIG, FakeGGUF, FakeHub


@pytest.mark.parametrize(
    ("charge", "limit"),
    [
        (lambda b: b.charge_bytes(1001, "x"), "max_fetch_bytes"),
        (lambda b: [b.charge_file("f") for _ in range(4)], "max_fetch_files"),
        (lambda b: b.charge_items(11, "items"), "max_header_items"),
        (lambda b: b.check_files(4, "shards"), "max_fetch_files"),
    ],
)
def test_each_charge_past_its_limit_names_it(charge: object, limit: str) -> None:
    """Bytes, files and items past their budget are FetchLimitExceeded naming the limit, its
    maximum and the count asked for, as LIMIT_EXCEEDED metadata."""
    limits = FetchLimits(max_fetch_bytes=1000, max_fetch_files=3, max_header_items=10)
    budget = FetchBudget(limits, "hf://org/name")
    with pytest.raises(FetchLimitExceeded) as caught:
        charge(budget)  # type: ignore[operator]
    meta = caught.value.metadata()
    assert (caught.value.reason, meta["limit"]) == ("LIMIT_EXCEEDED", limit)
    assert meta["maximum"] == str(getattr(limits, limit))
    assert meta["source"] == "hf://org/name"


def test_a_refused_charge_takes_nothing() -> None:
    """A charge that would pass the byte budget is refused whole; what is left stays usable."""
    budget = FetchBudget(FetchLimits(max_fetch_bytes=100), "s")
    budget.charge_bytes(60, "a")
    with pytest.raises(FetchLimitExceeded):
        budget.charge_bytes(41, "b")
    budget.charge_bytes(40, "c")
    assert budget.remaining_bytes == 0


def test_limits_come_from_the_environment() -> None:
    """LLMGW_PLANNER_<LIMIT> sets a limit; zero or a word stops the server with the name."""
    limits = FetchLimits.from_env({"LLMGW_PLANNER_MAX_FETCH_BYTES": "4096"})
    assert limits.max_fetch_bytes == 4096
    assert limits.max_fetch_files == FetchLimits().max_fetch_files
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ValueError, match="LLMGW_PLANNER_MAX_RESOLUTIONS"):
            FetchLimits.from_env({"LLMGW_PLANNER_MAX_RESOLUTIONS": bad})


def test_gate_holds_per_caller_and_total_shares() -> None:
    """A caller past its share is refused (scope identity) while another gets in; past the
    total everyone is (scope total); a place given back (twice is once) lets one in again."""
    gate = ResolutionGate(FetchLimits(max_resolutions=3, max_resolutions_per_identity=2))
    first = gate.acquire("user:a")
    gate.acquire("user:a")
    with pytest.raises(ResolutionsBusy) as caught:
        gate.acquire("user:a")
    assert caught.value.metadata()["scope"] == "identity"
    gate.acquire("user:b")
    with pytest.raises(ResolutionsBusy) as caught:
        gate.acquire("user:c")
    assert caught.value.metadata() == {"limit": "max_resolutions", "maximum": "3", "scope": "total"}
    first()
    first()
    assert gate.running == 2
    gate.acquire("user:c")


async def test_resolver_refuses_a_callers_fetch_past_its_share() -> None:
    """With two fetches of one caller held open, its third distinct source is ResolutionsBusy,
    another caller's goes ahead, joining a fetch under way costs no place, and once the held
    fetches end the caller may fetch again."""
    hold = asyncio.Event()
    repos = {f"org/m{i}": LLAMA_CONFIG for i in range(5)}
    hub = FakeHub(repos, hold=hold)
    resolver = ShapeResolver(
        gguf_reader=FakeGGUF(),
        hf_fetcher=hub,
        fetch_limits=FetchLimits(max_resolutions=8, max_resolutions_per_identity=2),
    )
    held = [
        asyncio.create_task(resolver.resolve(f"hf://org/m{i}", caller="user:v")) for i in (0, 1)
    ]
    await asyncio.sleep(0)
    with pytest.raises(ResolutionsBusy):
        await resolver.resolve("hf://org/m2", caller="user:v")
    joined = asyncio.create_task(resolver.resolve("hf://org/m0", caller="user:v"))
    other = asyncio.create_task(resolver.resolve("hf://org/m3", caller="user:w"))
    await asyncio.sleep(0)
    hold.set()
    await asyncio.gather(*held, joined, other)
    assert len(hub.calls) == 3  # m0, m1, m3: the join and the refusal fetched nothing
    await resolver.resolve("hf://org/m2", caller="user:v")
