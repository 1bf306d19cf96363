"""The fleet's application layer without gRPC: SetGPUs and the catalog's changes over a real
store and controller, a fake clock and a scripted planner; each guard refuses before anything
is asked or written."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_svc.app import Applied, ChangeOptions, FleetApp
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain import errors
from fleet_svc.domain.asked import ContextAsk, GPUsAsk
from fleet_svc.domain.catalog import Entry
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.reports import Observed
from fleet_svc.domain.rollout import EventKind, RolloutState, Strategy
from fleet_svc.planner import Planned
from fleet_svc.store.base import RolloutRequest, StoreUnavailable
from fleet_svc.store.rows import rollout_record
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.card import Card
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

    async def plan_gpus(self, entry: Entry, inventory: Inventory, ask: GPUsAsk) -> Planned:
        self.asked.append((entry.name, inventory))
        gpus = ask.gpus
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
        return Planned(profiles=profiles, report=f"gpus={gpus}".encode())

    async def size_context(self, entry: Entry, inventory: Inventory, ask: ContextAsk) -> Planned:
        self.asked.append((entry.name, inventory))
        return Planned(entry.model.profiles, report=b"", context_length=ask.tokens, max_output=1024)

    async def close(self) -> None:
        pass


class Link:
    """A fake agent stream that keeps the replica ids of each desired set it is sent."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def send_desired(
        self, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
    ) -> None:
        self.sent.append(sorted(r.id for r in replicas))

    def close(self, reason: str) -> None:
        pass


class Fleet:
    """An application over a store, a controller with one 4-card L4 node, a scripted planner."""

    def __init__(self, path: Path) -> None:
        self.clock = FakeClock()
        self.store = SQLiteStore(path / "fleet.db", clock=self.clock.wall)
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
        self.link = Link()
        self.controller.agent_connected(
            NodeView(name="n1", cards=cards, memory_bytes=1 << 36), [], self.link
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


async def committed(
    fleet: Fleet,
    plan: Callable[[], Awaitable[tuple[Planned, Callable[[], Applied]]]],
    options: ChangeOptions,
) -> tuple[Planned, Applied]:
    """A planned change as the servicer makes it: planned, then committed through
    FleetApp.once (or, dry, FleetApp.dry), then one controller tick, which takes it up from
    the store (no loop runs in these tests)."""
    got: dict[str, Planned] = {}

    async def prepare() -> Callable[[], Applied]:
        got["planned"], commit = await plan()
        return commit

    if options.dry_run:
        applied = await fleet.app.dry(prepare)
    else:
        made: list[Applied] = []

        async def encoded() -> Callable[[], bytes]:
            commit = await prepare()

            def run() -> bytes:
                made.append(commit())
                return b""

            return run

        await fleet.app.once("", "SetGPUs", "", encoded)
        (applied,) = made
    fleet.controller.tick()
    return got["planned"], applied


async def set_gpus(
    fleet: Fleet, name: str, *, gpus: int, profile: str, etag: str, options: ChangeOptions
) -> tuple[Planned, Applied]:
    """SetGPUs through the production path (`committed`)."""
    return await committed(
        fleet,
        lambda: fleet.app.prepare_gpus(name, GPUsAsk(gpus, profile), etag=etag, options=options),
        options,
    )


async def set_context(
    fleet: Fleet, name: str, *, tokens: int, slots: int, etag: str, options: ChangeOptions
) -> tuple[Planned, Applied]:
    """SetContext through the production path (`committed`)."""
    return await committed(
        fleet,
        lambda: fleet.app.prepare_context(
            name, ContextAsk(tokens, slots), etag=etag, options=options
        ),
        options,
    )


async def test_set_gpus_commits_the_planner_s_profiles_and_rolls_them_out(fleet: Fleet) -> None:
    """SetGPUs asks the planner with the live inventory, writes its profiles as the next
    revision and starts a rollout replacing the serving replica."""
    etag = fleet.app.model("m").etag
    planned, applied = await set_gpus(fleet, "m", gpus=2, profile="", etag=etag, options=by())
    ((_, inventory),) = fleet.planner.asked
    assert [(n.name, n.gpus, n.free_gpus) for n in inventory.nodes] == [("n1", 4, 3)]
    assert planned.report == b"gpus=2"
    assert applied.revision.revision == 2 and applied.revision.updated_by == "bob"
    assert fleet.app.model("m").model.profiles[0].args == ("--tensor-parallel-size", "2")
    assert applied.restarted == 1 and applied.rollout_id
    assert fleet.controller.running_rollout("m") is not None


async def test_a_dry_run_writes_nothing(fleet: Fleet) -> None:
    """A dry run answers the model it would write, unwritten (revision 0, no etag: it predicts
    neither), the replicas it would restart, and starts nothing."""
    _, applied = await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by(dry_run=True))
    assert (applied.revision.revision, applied.revision.etag) == (0, "")
    assert applied.revision.model.profiles[0].args == ("--tensor-parallel-size", "2")
    assert (applied.rollout_id, applied.restarted, applied.unchanged) == ("", 1, False)
    assert fleet.app.model("m").revision == 1
    assert fleet.controller.running_rollout("m") is None


async def test_a_stale_etag_is_refused_before_the_planner_is_asked(fleet: Fleet) -> None:
    """An etag that is not the model's is refused, naming both (the revision number is not
    an etag); the planner is not asked and nothing is written."""
    current = fleet.app.model("m").etag
    for stale in ("7", "1"):
        with pytest.raises(errors.StaleRevision) as caught:
            await set_gpus(fleet, "m", gpus=2, profile="", etag=stale, options=by())
        assert caught.value.message == (
            f"model 'm' changed since etag {stale} was read (now revision 1, etag {current}):"
            " read it again and retry"
        )
        assert caught.value.metadata()["current_etag"] == current
    assert fleet.planner.asked == []


async def test_a_change_made_while_the_planner_thinks_wins(fleet: Fleet) -> None:
    """When the model changes while the planner is asked, the planner's answer is not applied."""

    def another_writer() -> None:
        fleet.app.update_model(
            ENTRY.with_model(replace(ENTRY.model, max_output=7)), "", by("carol")
        )

    fleet.planner.meanwhile = another_writer
    with pytest.raises(errors.StaleRevision):
        await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by())
    assert fleet.app.model("m").updated_by == "carol"


async def test_a_running_rollout_refuses_or_is_superseded(fleet: Fleet) -> None:
    """While a rollout runs, a second SetGPUs is refused (saying what would work) unless it
    supersedes it, which cancels the first; catalog writes are refused too."""
    _, first = await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by())
    with pytest.raises(errors.RolloutInProgress, match="wait for it, cancel it, or supersede"):
        await set_gpus(fleet, "m", gpus=4, profile="", etag="", options=by())
    with pytest.raises(errors.RolloutInProgress, match="wait for it, cancel it, or supersede"):
        fleet.app.update_model(ENTRY, "", by())
    with pytest.raises(errors.RolloutInProgress):
        fleet.app.delete_model("m", "", "bob")
    _, second = await set_gpus(
        fleet,
        "m",
        gpus=1,
        profile="",
        etag="",
        options=by(supersede=True, strategy=Strategy.IN_PLACE),
    )
    assert fleet.app.rollout(first.rollout_id).state is RolloutState.CANCELLED
    assert fleet.controller.running_rollout("m") == fleet.app.rollout(second.rollout_id)


async def test_no_room_beside_is_refused_before_anything_is_written(fleet: Fleet) -> None:
    """Beside needs a node with the new replica's cards free: 8 cards on a 4-card node is
    refused with the numbers, and the catalog keeps its revision."""
    with pytest.raises(errors.NoRoomBeside) as caught:
        await set_gpus(fleet, "m", gpus=8, profile="", etag="", options=by())
    assert (caught.value.need_gpus, caught.value.most_free) == (8, 3)
    assert fleet.app.model("m").revision == 1


async def test_a_declared_model_is_changed_only_in_its_file(fleet: Fleet) -> None:
    """A model the settings file declares is refused for every change through the API."""
    d = replace(ENTRY, model=replace(ENTRY.model, name="d"))
    fleet.catalog.declare([d], "cluster.yaml")
    changes: list[Callable[[], object]] = [
        lambda: fleet.app.create_model(d, "bob"),
        lambda: fleet.app.update_model(d, "", by()),
        lambda: fleet.app.delete_model("d", "", "bob"),
    ]
    for change in changes:
        with pytest.raises(errors.ModelDeclared, match=r"cluster.yaml"):
            change()
    with pytest.raises(errors.ModelDeclared):
        await set_gpus(fleet, "d", gpus=2, profile="", etag="", options=by())


async def test_create_update_delete(fleet: Fleet) -> None:
    """Create refuses a name in use; update and delete are guarded by the etag; a deletion is a
    revision, and the name can be created again after it."""
    with pytest.raises(errors.ModelExists):
        fleet.app.create_model(ENTRY, "bob")
    changed = ENTRY.with_model(replace(ENTRY.model, max_output=7))
    with pytest.raises(errors.StaleRevision):
        fleet.app.update_model(changed, "9", by())
    updated = fleet.app.update_model(changed, fleet.app.model("m").etag, by())
    assert updated.revision.revision == 2 and not updated.unchanged
    assert fleet.app.delete_model("m", updated.revision.etag, "bob").deleted
    with pytest.raises(errors.ModelNotFound):
        fleet.app.model("m")
    assert fleet.app.create_model(ENTRY, "bob").revision == 4


def answers(runs: list[int]) -> Callable[[], Awaitable[Callable[[], bytes]]]:
    """A prepare whose commit counts its runs and answers with the count."""

    async def prepare() -> Callable[[], bytes]:
        def commit() -> bytes:
            runs.append(1)
            return f"answer {len(runs)}".encode()

        return commit

    return prepare


async def test_a_request_id_is_answered_once(fleet: Fleet) -> None:
    """A retried request id gets the first answer without running again; reusing it for
    another method is refused."""
    runs: list[int] = []
    make = answers(runs)
    assert await fleet.app.once("req-1", "SetGPUs", "f1", make) == b"answer 1"
    assert await fleet.app.once("req-1", "SetGPUs", "f1", make) == b"answer 1"
    assert await fleet.app.once("", "SetGPUs", "f1", make) == b"answer 2"  # no id: no memory
    with pytest.raises(errors.RequestIdReused) as caught:
        await fleet.app.once("req-1", "DeleteModel", "f1", make)
    assert caught.value.method == "SetGPUs"
    assert len(runs) == 2


async def test_a_request_id_sent_with_another_body_is_refused(fleet: Fleet) -> None:
    """The same id with another request's fingerprint is REQUEST_ID_REUSED and runs nothing;
    the first request's retry still gets its answer."""
    runs: list[int] = []
    assert await fleet.app.once("req-1", "SetGPUs", "body-a", answers(runs)) == b"answer 1"
    with pytest.raises(errors.RequestIdReused) as caught:
        await fleet.app.once("req-1", "SetGPUs", "body-b", answers(runs))
    assert caught.value.metadata()["request_id"] == "req-1"
    assert "another SetGPUs request" in caught.value.message
    assert await fleet.app.once("req-1", "SetGPUs", "body-a", answers(runs)) == b"answer 1"
    assert runs == [1]


async def test_a_request_id_is_new_again_after_its_window(fleet: Fleet) -> None:
    """Past the request-id window the id's answer is pruned and the id answers afresh."""
    runs: list[int] = []
    fleet.app.request_id_window_s = 3600.0
    assert await fleet.app.once("req-1", "SetGPUs", "a", answers(runs)) == b"answer 1"
    fleet.clock.advance(3599.0)
    assert await fleet.app.once("req-1", "SetGPUs", "a", answers(runs)) == b"answer 1"
    fleet.clock.advance(2.0)
    assert await fleet.app.once("req-1", "SetGPUs", "b", answers(runs)) == b"answer 2"
    stored = fleet.store.get_answer("req-1")
    assert stored is not None and stored.fingerprint == "b" and stored.answer == b"answer 2"


async def test_a_request_id_past_its_window_is_new_before_its_row_is_pruned(
    fleet: Fleet,
) -> None:
    """An id whose answer is older than the window answers afresh even while its row is still
    stored (answers are pruned at most once a minute): the old row gives way to the new."""
    runs: list[int] = []
    fleet.app.request_id_window_s = 30.0
    assert await fleet.app.once("req-1", "SetGPUs", "a", answers(runs)) == b"answer 1"
    fleet.clock.advance(31.0)  # past the window, before the next prune is due
    assert fleet.store.get_answer("req-1") is not None
    assert await fleet.app.once("req-1", "CreateModel", "b", answers(runs)) == b"answer 2"
    stored = fleet.store.get_answer("req-1")
    assert stored is not None and (stored.method, stored.answer) == ("CreateModel", b"answer 2")


async def test_a_retry_whose_preparing_fails_gets_its_first_answer(fleet: Fleet) -> None:
    """A retry is prepared again; when preparing fails (its first attempt started a rollout,
    say), the id's first answer is given, and an id never answered gets the failure."""
    runs: list[int] = []
    assert await fleet.app.once("req-1", "SetGPUs", "a", answers(runs)) == b"answer 1"

    async def refused() -> Callable[[], bytes]:
        raise errors.RolloutInProgress("model 'm' is rolling out", name="m", rollout_id="ro-1")

    assert await fleet.app.once("req-1", "SetGPUs", "a", refused) == b"answer 1"
    with pytest.raises(errors.RequestIdReused):
        await fleet.app.once("req-1", "SetGPUs", "other body", refused)
    with pytest.raises(errors.RolloutInProgress):
        await fleet.app.once("req-2", "SetGPUs", "a", refused)
    assert runs == [1] and fleet.store.get_answer("req-2") is None


async def test_an_answer_without_a_fingerprint_matches_no_request(fleet: Fleet) -> None:
    """An answer row without a fingerprint (schema step 3 left those '') is no request's:
    its id is refused, whatever the body, and runs nothing."""
    fleet.store.put_answer("old", "SetContext", b"old answer")
    runs: list[int] = []
    with pytest.raises(errors.RequestIdReused):
        await fleet.app.once("old", "SetContext", "any", answers(runs))
    assert runs == []


async def test_a_change_handing_nothing_over_is_taken_up_without_looking_for_pending_work(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change with no rollout (one replica more of the same spec) reaches the next tick's
    wants, which places the new replica without reading the store's pending rollouts and
    requests; a change with a rollout is taken up from the store by the next tick."""
    reads: list[int] = []
    listed = fleet.store.list_rollout_requests

    def counted() -> list[RolloutRequest]:
        reads.append(1)
        return listed()

    monkeypatch.setattr(fleet.store, "list_rollout_requests", counted)
    more = ENTRY.with_model(replace(ENTRY.model, profiles=(replace(PROFILE, replicas=2),)))

    async def scale() -> Callable[[], bytes]:
        return lambda: fleet.app.update_model(more, "", by()).revision.etag.encode()

    await fleet.app.once("", "UpdateModel", "f", scale)
    fleet.controller.tick()
    assert reads == []
    assert sorted(r.revision for r in fleet.controller.state.replicas.values()) == [1, 2]
    _, applied = await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by())
    assert applied.rollout_id and reads == [1]
    assert fleet.controller.running_rollout("m") is not None


async def test_a_change_and_its_request_id_are_one_transaction(fleet: Fleet) -> None:
    """A commit that fails after writing the catalog leaves neither the revision nor the
    request id: the retry runs the change again, once."""

    async def prepare() -> Callable[[], bytes]:
        def commit() -> bytes:
            fleet.app.update_model(ENTRY.with_model(replace(ENTRY.model, max_output=7)), "", by())
            raise RuntimeError("the fleet died before answering")

        return commit

    with pytest.raises(RuntimeError):
        await fleet.app.once("req-1", "UpdateModel", "f", prepare)
    assert fleet.store.get_answer("req-1") is None
    assert [r.revision for r in fleet.app.history("m")] == [1]
    runs: list[int] = []
    assert await fleet.app.once("req-1", "UpdateModel", "f", answers(runs)) == b"answer 1"


def settle(fleet: Fleet) -> None:
    """Tick as an agent would answer: started replicas turn READY, stopping ones STOPPED, the
    drain delay passes."""
    node = fleet.controller.state.nodes["n1"]
    for _ in range(10):
        fleet.serve()
        fleet.clock.advance(2.5)
        fleet.controller.heartbeat("n1", node.cards, node.memory_bytes)
        for r in list(fleet.controller.state.replicas.values()):
            if r.phase is P.STOPPING:
                fleet.controller.observe("n1", Observed(r.id, r.revision, P.STOPPED, ""))


def finish(fleet: Fleet) -> None:
    """Settle until no rollout of m runs."""
    for _ in range(5):
        settle(fleet)
        if fleet.controller.running_rollout("m") is None:
            return
    raise AssertionError("the rollout of m did not end")


async def test_a_change_that_changes_nothing_writes_nothing(fleet: Fleet) -> None:
    """SetGPUs to the cards the model has, SetContext to its context and an identical
    UpdateModel are answered unchanged from the first call: the current revision and etag, no
    rollout, and nothing the planner filled in (its max_output, tp) is written as if asked."""
    current = fleet.app.model("m")
    _, gpus = await set_gpus(fleet, "m", gpus=1, profile="", etag="", options=by())
    _, context = await set_context(fleet, "m", tokens=8192, slots=0, etag="", options=by())
    same = fleet.app.update_model(current.entry, current.etag, by())
    dry = fleet.app.update_model(current.entry, "", by(dry_run=True))
    for applied in (gpus, context, same, dry):
        assert applied.unchanged and applied.rollout_id == "" and applied.restarted == 0
        assert (applied.revision.revision, applied.revision.etag) == (1, current.etag)
    assert len(fleet.planner.asked) == 2  # the planner still checked both
    assert [r.revision for r in fleet.app.history("m")] == [1]
    assert fleet.app.model("m").model.max_output == 0
    await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by())
    assert fleet.app.model("m").revision == 2  # a count it does not have is a change
    assert len(fleet.app.rollouts("m")) == 1


async def test_a_context_change_keeps_an_unset_max_output_unset(fleet: Fleet) -> None:
    """A new context writes the context; a max_output the caller never set stays unset (its
    default follows the context), one the caller set takes the planner's value."""
    _, applied = await set_context(fleet, "m", tokens=4096, slots=0, etag="", options=by())
    written = fleet.app.model("m").model
    assert not applied.unchanged and (written.context_length, written.max_output) == (4096, 0)
    with_output = fleet.app.model("m").entry
    fleet.app.update_model(
        with_output.with_model(replace(with_output.model, max_output=512)), "", by()
    )
    finish(fleet)
    await set_context(fleet, "m", tokens=8192, slots=0, etag="", options=by())
    assert fleet.app.model("m").model.max_output == 1024


async def test_the_etag_follows_the_content_not_the_revision(fleet: Fleet) -> None:
    """A model's etag is opaque and changes with its content only: writing the first
    content back gives the first etag again at a new revision."""
    first = fleet.app.model("m")
    assert first.etag and first.etag != str(first.revision)
    other = fleet.app.update_model(
        first.entry.with_model(replace(ENTRY.model, max_output=9)), first.etag, by()
    )
    assert other.revision.etag not in ("", first.etag)
    back = fleet.app.update_model(first.entry, other.revision.etag, by())
    assert (back.revision.revision, back.revision.etag) == (3, first.etag)


async def test_update_model_rolls_out_what_replicas_run(fleet: Fleet) -> None:
    """UpdateModel with new args starts a rollout replacing the serving replica, as SetGPUs
    does; dry it only says what it would restart; beside needs room."""
    new_args = replace(PROFILE, args=("--tensor-parallel-size", "1", "--max-model-len", "4096"))
    changed = ENTRY.with_model(replace(ENTRY.model, profiles=(new_args,)))
    dry = fleet.app.update_model(changed, "", by(dry_run=True))
    assert (dry.rollout_id, dry.restarted, dry.revision.revision) == ("", 1, 0)
    assert fleet.controller.running_rollout("m") is None
    applied = fleet.app.update_model(changed, "", by())
    assert applied.rollout_id and applied.restarted == 1
    assert fleet.app.rollout(applied.rollout_id).kind == "update"
    with pytest.raises(errors.RolloutInProgress):
        fleet.app.update_model(ENTRY, "", by())
    finish(fleet)
    (replica,) = fleet.controller.state.replicas.values()
    assert replica.id != "r1" and replica.spec.args == new_args.args
    huge = replace(new_args, gpus_per_node=8)
    with pytest.raises(errors.NoRoomBeside):
        fleet.app.update_model(ENTRY.with_model(replace(ENTRY.model, profiles=(huge,))), "", by())


async def test_a_replica_count_change_only_scales(fleet: Fleet) -> None:
    """UpdateModel of the replica count alone writes a revision and starts no rollout: the
    controller adds replicas beside the running one, then removes down to one, never
    restarting the replica that serves."""
    more = ENTRY.with_model(replace(ENTRY.model, profiles=(replace(PROFILE, replicas=3),)))
    applied = fleet.app.update_model(more, "", by())
    assert (applied.rollout_id, applied.restarted, applied.unchanged) == ("", 0, False)
    fleet.serve()
    ready = {r.id for r in fleet.controller.state.replicas.values() if r.phase is P.READY}
    assert len(ready) == 3 and "r1" in ready
    fleet.app.update_model(ENTRY, "", by())
    settle(fleet)
    left = [r for r in fleet.controller.state.replicas.values() if not r.retire]
    assert len(left) == 1 and left[0].id in ready and left[0].phase is P.READY
    assert fleet.app.rollouts("m") == []


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


def planned_gpus(
    fleet: Fleet, gpus: int, options: ChangeOptions
) -> Callable[[], Awaitable[Callable[[], bytes]]]:
    """SetGPUs of m as the servicer hands it to FleetApp.once: plan, then a commit that
    answers the rollout's id."""

    async def prepare() -> Callable[[], bytes]:
        _, commit = await fleet.app.prepare_gpus("m", GPUsAsk(gpus), etag="", options=options)
        return lambda: commit().rollout_id.encode()

    return prepare


async def test_a_change_whose_commit_fails_leaves_no_rollout_and_no_engine_change(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SetGPUs whose transaction fails after its rollout was written (the request id's
    answer cannot be stored) leaves the revision as it was, no rollout in the store or the
    controller, and no agent told anything new however long the controller goes on."""
    assert fleet.link.sent == [["r1"]]

    def full_disk(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable(fleet.store.where, "SQLite: database or disk is full")

    monkeypatch.setattr(fleet.store, "put_answer", full_disk)
    with pytest.raises(StoreUnavailable):
        await fleet.app.once("req-1", "SetGPUs", "f", planned_gpus(fleet, 2, by()))
    monkeypatch.undo()
    settle(fleet)
    assert [r.revision for r in fleet.app.history("m")] == [1]
    assert fleet.store.list_rollouts() == [] and fleet.controller.rollouts == {}
    assert {tuple(ids) for ids in fleet.link.sent} == {("r1",)}  # resent unacked, unchanged
    assert [(r.id, r.revision) for r in fleet.controller.state.replicas.values()] == [("r1", 1)]
    assert fleet.store.get_answer("req-1") is None


async def test_a_committed_change_runs_once_the_controller_takes_it_up(fleet: Fleet) -> None:
    """A change commits its rollout PENDING and touches no controller state; the next tick
    takes it up from the store, starts it and tells the agent; a retry of the request id
    answers the same rollout and starts nothing more."""
    first = await fleet.app.once("req-1", "SetGPUs", "f", planned_gpus(fleet, 2, by()))
    rid = first.decode()
    stored = fleet.store.get_rollout(rid)
    assert stored is not None and stored.state == "PENDING"
    assert fleet.controller.rollouts == {} and len(fleet.controller.state.replicas) == 1
    with pytest.raises(errors.RolloutInProgress):
        await fleet.app.once("req-2", "SetGPUs", "g", planned_gpus(fleet, 4, by()))
    fleet.controller.tick()
    assert fleet.app.rollout(rid).state is RolloutState.RUNNING
    assert set(fleet.controller.rollouts) == {rid}
    assert fleet.link.sent[-1] == ["r1", "r2"]
    again = await fleet.app.once("req-1", "SetGPUs", "f", planned_gpus(fleet, 2, by()))
    assert again == first
    fleet.controller.tick()
    assert len(fleet.controller.state.replicas) == 2
    events = [e.event.kind for e in fleet.app.rollout_events(rid)]
    assert events.count(EventKind.ROLLOUT_STARTED) == 1


async def test_a_cancel_is_a_request_the_controller_carries_out(fleet: Fleet) -> None:
    """CancelRollout records a request and answers the rollout as stored; the controller's
    next tick ends it CANCELLED, stops its new replica and forgets the request."""
    _, applied = await set_gpus(fleet, "m", gpus=2, profile="", etag="", options=by())
    assert fleet.link.sent[-1] == ["r1", "r2"]
    answered: list[RolloutState] = []

    async def prepare() -> Callable[[], bytes]:
        def commit() -> bytes:
            answered.append(fleet.app.cancel_rollout(applied.rollout_id, "carol").state)
            return b""

        return commit

    await fleet.app.once("", "CancelRollout", "", prepare)
    assert answered == [RolloutState.RUNNING]
    assert [r.rollout_id for r in fleet.store.list_rollout_requests()] == [applied.rollout_id]
    settle(fleet)
    ended = fleet.app.rollout(applied.rollout_id)
    assert (ended.state, ended.reason) == (RolloutState.CANCELLED, "cancelled by carol")
    assert fleet.store.list_rollout_requests() == []
    assert [r.id for r in fleet.controller.state.replicas.values()] == ["r1"]


async def test_a_pending_rollout_cancelled_before_it_started_starts_nothing(
    fleet: Fleet,
) -> None:
    """A rollout cancelled before the controller took it up ends CANCELLED at the next
    tick with no step begun and no replica created."""
    first = await fleet.app.once("req-1", "SetGPUs", "f", planned_gpus(fleet, 2, by()))
    fleet.app.cancel_rollout(first.decode(), "carol")
    fleet.controller.tick()  # the catalog's revision moved: the store is read
    ended = fleet.app.rollout(first.decode())
    assert ended.state is RolloutState.CANCELLED
    assert {s.new_id for s in ended.steps} == {""}
    assert list(fleet.controller.state.replicas) == ["r1"]
    kinds = [(e.event.kind, e.state) for e in fleet.app.rollout_events(first.decode())]
    assert kinds == [(EventKind.ROLLOUT_CANCELLED, RolloutState.CANCELLED)]


async def test_a_pending_rollout_of_a_superseded_revision_never_starts(fleet: Fleet) -> None:
    """A pending rollout whose revision is no longer the catalog's (written by a fleet that
    died or lost its lease before its controller took it up, then changed again) ends
    CANCELLED saying which revision the catalog holds; one of the current revision runs."""
    rev = fleet.app.model("m")
    stale = fleet.app.update_model(
        ENTRY.with_model(replace(ENTRY.model, source="hf://org/m2")), rev.etag, by()
    )
    record = fleet.store.get_rollout(stale.rollout_id)
    assert record is not None
    fleet.store.put_rollout(replace(record, id="ro-old", spec={**record.spec, "to_revision": 1}))
    fleet.controller.tick()
    old = fleet.app.rollout("ro-old")
    assert old.state is RolloutState.CANCELLED
    assert old.reason == "the catalog holds revision 2 of m, not 1"
    assert fleet.app.rollout(stale.rollout_id).state is RolloutState.RUNNING
    assert rollout_record(fleet.app.rollout(stale.rollout_id)).state == "RUNNING"
