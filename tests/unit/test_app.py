"""The fleet's application layer without gRPC: SetGPUs and the catalog's changes over a real
store and controller, a fake clock and a scripted planner; each guard refuses before anything
is asked or written."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_svc.app import ChangeOptions, FleetApp
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Entry
from fleet_svc.domain.nodes import Card, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.reports import Observed
from fleet_svc.domain.rollout import RolloutState, Strategy
from fleet_svc.planner import Planned
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.model import Inventory, Model, Profile
from llmgw.testing.clock import FakeClock

P = ReplicaPhase
PROFILE = Profile(
    name="gpu",
    engine="vllm",
    args=("--tensor-parallel-size", "1"),
    gpu_class="L4",
    gpus_per_node=1,
    replicas=1,
)
ENTRY = Entry(Model(name="m", source="hf://org/m", context_length=8192, profiles=(PROFILE,)))


class ScriptedPlanner:
    """A planner that answers PlanGPUs with the profile on `gpus` cards, and can run a hook
    while it is being asked (another writer changing the model meanwhile)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Inventory]] = []
        self.meanwhile: Callable[[], None] = lambda: None

    async def plan_gpus(
        self, entry: Entry, inventory: Inventory, *, gpus: int, profile: str
    ) -> Planned:
        self.asked.append((entry.name, inventory))
        self.meanwhile()
        profiles = tuple(
            replace(
                p,
                gpus_per_node=gpus,
                tp=gpus,
                args=("--tensor-parallel-size", str(gpus)),
            )
            for p in entry.model.profiles
        )
        return Planned(profiles=profiles, report={"gpus": gpus})

    async def size_context(
        self, entry: Entry, inventory: Inventory, *, tokens: int, slots: int
    ) -> Planned:
        self.asked.append((entry.name, inventory))
        return Planned(entry.model.profiles, report={}, context_length=tokens, max_output=1024)

    async def close(self) -> None:
        pass


class Link:
    """A fake agent stream that drops what it is sent."""

    def send_desired(self, version: int, replicas: Sequence[ReplicaState]) -> None:
        pass

    def close(self, reason: str) -> None:
        pass


class Fleet:
    """An application over a store, a controller with one 4-card L4 node, a scripted planner."""

    def __init__(self, path: Path) -> None:
        self.clock = FakeClock()
        self.store = SQLiteStore(path / "fleet.db")
        self.catalog = Catalog(self.store, self.clock.wall)
        counter = itertools.count(1)
        self.controller = Controller(
            self.store,
            self.catalog.wants,
            clock=self.clock,
            new_id=lambda: f"r{next(counter)}",
        )
        self.planner = ScriptedPlanner()
        self.app = FleetApp(
            self.catalog, self.controller, self.store, self.planner, self.clock.wall
        )
        cards = tuple(Card(i, model="L4", memory_total_bytes=24 << 30) for i in range(4))
        self.controller.agent_connected(
            NodeView(name="n1", cards=cards, memory_bytes=1 << 36), [], Link()
        )

    def serve(self) -> None:
        """Tick until every replica placed is READY (the agent reporting it healthy)."""
        for _ in range(5):
            self.controller.tick()
            for r in list(self.controller.state.replicas.values()):
                if r.phase is P.STARTING:
                    self.controller.observe("n1", Observed(r.id, r.revision, P.READY, "h:1"))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet serving model m on one READY replica (revision 1)."""
    f = Fleet(tmp_path)
    f.app.create_model(ENTRY, "alice")
    f.serve()
    yield f
    f.store.close()


def by(name: str = "bob", **options: object) -> ChangeOptions:
    """Change options for a change `name` asks for."""
    return ChangeOptions(by=name, **options)  # type: ignore[arg-type]


async def test_set_gpus_commits_the_planner_s_profiles_and_rolls_them_out(fleet: Fleet) -> None:
    """SetGPUs asks the planner with the live inventory, writes its profiles as the next
    revision and starts a rollout replacing the serving replica."""
    planned, applied = await fleet.app.set_gpus("m", gpus=2, profile="", etag="1", options=by())
    ((_, inventory),) = fleet.planner.asked
    assert [(n.name, n.gpus, n.free_gpus) for n in inventory.nodes] == [("n1", 4, 3)]
    assert planned.report == {"gpus": 2}
    assert applied.revision.revision == 2 and applied.revision.updated_by == "bob"
    assert fleet.app.model("m").model.profiles[0].args == ("--tensor-parallel-size", "2")
    assert applied.restarted == 1 and applied.rollout_id
    assert fleet.controller.running_rollout("m") is not None


async def test_a_dry_run_writes_nothing(fleet: Fleet) -> None:
    """A dry run answers the revision it would write and starts nothing."""
    _, applied = await fleet.app.set_gpus(
        "m", gpus=2, profile="", etag="", options=by(dry_run=True)
    )
    assert (applied.revision.revision, applied.rollout_id, applied.restarted) == (2, "", 1)
    assert fleet.app.model("m").revision == 1
    assert fleet.controller.running_rollout("m") is None


async def test_a_stale_etag_is_refused_before_the_planner_is_asked(fleet: Fleet) -> None:
    """An etag that is not the model's revision is refused, naming both; the planner is not
    asked and nothing is written."""
    with pytest.raises(errors.StaleRevision) as caught:
        await fleet.app.set_gpus("m", gpus=2, profile="", etag="7", options=by())
    assert caught.value.message == ("model 'm' is at revision 1, not 7: read it again and retry")
    assert fleet.planner.asked == []


async def test_a_change_made_while_the_planner_thinks_wins(fleet: Fleet) -> None:
    """When the model changes while the planner is asked, the planner's answer is not applied."""

    def another_writer() -> None:
        fleet.app.update_model(ENTRY, "", "carol")

    fleet.planner.meanwhile = another_writer
    with pytest.raises(errors.StaleRevision):
        await fleet.app.set_gpus("m", gpus=2, profile="", etag="", options=by())
    assert fleet.app.model("m").updated_by == "carol"


async def test_a_running_rollout_refuses_or_is_superseded(fleet: Fleet) -> None:
    """While a rollout runs, a second SetGPUs is refused (saying what would work) unless it
    supersedes it, which cancels the first; catalog writes are refused too."""
    _, first = await fleet.app.set_gpus("m", gpus=2, profile="", etag="", options=by())
    with pytest.raises(errors.RolloutInProgress, match="wait for it, cancel it, or supersede"):
        await fleet.app.set_gpus("m", gpus=4, profile="", etag="", options=by())
    with pytest.raises(errors.RolloutInProgress, match="wait for it or cancel it first"):
        fleet.app.update_model(ENTRY, "", "bob")
    with pytest.raises(errors.RolloutInProgress):
        fleet.app.delete_model("m", "", "bob")
    _, second = await fleet.app.set_gpus(
        "m", gpus=1, profile="", etag="", options=by(supersede=True, strategy=Strategy.IN_PLACE)
    )
    assert fleet.app.rollout(first.rollout_id).state is RolloutState.CANCELLED
    assert fleet.controller.running_rollout("m") == fleet.app.rollout(second.rollout_id)


async def test_no_room_beside_is_refused_before_anything_is_written(fleet: Fleet) -> None:
    """Beside needs a node with the new replica's cards free: 8 cards on a 4-card node is
    refused with the numbers, and the catalog keeps its revision."""
    with pytest.raises(errors.NoRoomBeside) as caught:
        await fleet.app.set_gpus("m", gpus=8, profile="", etag="", options=by())
    assert (caught.value.need_gpus, caught.value.most_free) == (8, 3)
    assert fleet.app.model("m").revision == 1


async def test_a_declared_model_is_changed_only_in_its_file(fleet: Fleet) -> None:
    """A model the settings file declares is refused for every change through the API."""
    d = replace(ENTRY, model=replace(ENTRY.model, name="d"))
    fleet.catalog.declare([d], "cluster.yaml")
    changes: list[Callable[[], object]] = [
        lambda: fleet.app.create_model(d, "bob"),
        lambda: fleet.app.update_model(d, "", "bob"),
        lambda: fleet.app.delete_model("d", "", "bob"),
    ]
    for change in changes:
        with pytest.raises(errors.ModelDeclared, match=r"cluster.yaml"):
            change()
    with pytest.raises(errors.ModelDeclared):
        await fleet.app.set_gpus("d", gpus=2, profile="", etag="", options=by())


async def test_create_update_delete(fleet: Fleet) -> None:
    """Create refuses a name in use; update and delete are guarded by the etag; a deletion is a
    revision, and the name can be created again after it."""
    with pytest.raises(errors.ModelExists):
        fleet.app.create_model(ENTRY, "bob")
    with pytest.raises(errors.StaleRevision):
        fleet.app.update_model(ENTRY, "9", "bob")
    assert fleet.app.update_model(ENTRY, "1", "bob").revision == 2
    assert fleet.app.delete_model("m", "2", "bob").deleted
    with pytest.raises(errors.ModelNotFound):
        fleet.app.model("m")
    assert fleet.app.create_model(ENTRY, "bob").revision == 4


async def test_a_request_id_is_answered_once(fleet: Fleet) -> None:
    """A retried request id gets the first answer without running again; reusing it for
    another method is refused."""
    runs: list[int] = []

    async def make() -> bytes:
        runs.append(1)
        return f"answer {len(runs)}".encode()

    assert await fleet.app.once("req-1", "SetGPUs", make) == b"answer 1"
    assert await fleet.app.once("req-1", "SetGPUs", make) == b"answer 1"
    assert await fleet.app.once("", "SetGPUs", make) == b"answer 2"  # no id: no memory
    with pytest.raises(errors.RequestIdReused) as caught:
        await fleet.app.once("req-1", "DeleteModel", make)
    assert caught.value.method == "SetGPUs"
    assert len(runs) == 2


def test_inventory_carries_the_agents_cuda_totals_and_engine_versions(tmp_path: Path) -> None:
    """The live inventory gives the planner each node's CUDA total (the smallest card's, and
    none when a card did not report one) and the engine versions its agent reported."""
    f = Fleet(tmp_path)
    cards = tuple(
        Card(i, model="H100-80GB", memory_total_bytes=81559 << 20, cuda_memory_total_bytes=c)
        for i, c in enumerate((81090 << 20, 81000 << 20))
    )
    f.controller.agent_connected(
        NodeView(name="n2", cards=cards, engine_versions={"vllm": "0.10.2"}), [], Link()
    )
    half = (cards[0], replace(cards[1], cuda_memory_total_bytes=0))
    f.controller.agent_connected(NodeView(name="n3", cards=half), [], Link())
    nodes = {n.name: n for n in f.app.inventory().nodes}
    assert nodes["n2"].gpu_cuda_memory_bytes == 81000 << 20
    assert nodes["n2"].engine_versions == (("vllm", "0.10.2"),)
    assert nodes["n3"].gpu_cuda_memory_bytes == 0
    assert nodes["n1"].engine_versions == ()
    f.store.close()
