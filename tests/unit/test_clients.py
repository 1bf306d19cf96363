"""llmgw.clients: a failed call becomes `Unreachable` or `Refused`, decoded once; UNAVAILABLE
alone is retried, a bounded number of times; a rollout watch resumes after a dropped stream
and never on INTERNAL. Against the real planner, and small real gRPC servers that fail on cue."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from llmgw.clients import AsyncPlannerClient, FleetClient, Refused, Unreachable
from llmgw.clients.convert import model_from_data
from llmgw.clients.errors import RETRY_ATTEMPTS, UNREACHABLE_CODES
from llmgw.clients.fleet import RECONNECT_S, RESUME_FOR_S
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.rpc.status import build_status
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline_data

LLAMA_8B = model_from_data(
    {
        "name": "llama-8b",
        "context_length": 8192,
        "shape": inline_data(LLAMA_31_8B),
        "profiles": [
            {
                "name": "gpu",
                "engine": "vllm",
                "args": ["--max-model-len", "8192"],
                "gpu_class": "H100-80GB",
                "gpus_per_node": 1,
            }
        ],
    }
)
EIGHT_H100 = common_pb2.Inventory(
    nodes=[common_pb2.InventoryNode(name="n", gpu_class="H100-80GB", gpus=8, free_gpus=8)]
)


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_async_planner_client_answers_from_the_real_planner() -> None:
    """SizeContext through the asyncio client returns the planner's change."""
    async with (
        running_planner() as (server, _stub, _channel),
        AsyncPlannerClient(f"127.0.0.1:{server.port}") as planner,
    ):
        answer = await planner.size_context(
            planner_pb2.SizeContextRequest(model=LLAMA_8B, tokens=32768, inventory=EIGHT_H100)
        )
    assert (answer.change.before, answer.change.after) == (8192, 32768)
    assert list(answer.profiles[0].args) == ["--max-model-len", "32768"]


async def test_a_planner_refusal_arrives_with_its_reason_and_metadata() -> None:
    """A refused PlanGPUs is `Refused` with the ErrorInfo's reason and facts, the gRPC code,
    and the whole status for a server to pass on."""
    async with (
        running_planner() as (server, _stub, _channel),
        AsyncPlannerClient(f"127.0.0.1:{server.port}") as planner,
    ):
        with pytest.raises(Refused) as caught:
            await planner.plan_gpus(
                planner_pb2.PlanGPUsRequest(model=LLAMA_8B, gpus=3, inventory=EIGHT_H100)
            )
    refused = caught.value
    assert refused.reason == "HEADS_NOT_DIVISIBLE"
    assert refused.code == "INVALID_ARGUMENT"
    assert refused.metadata is not None and refused.metadata["valid_counts"] == "1,2,4,8"
    assert refused.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert refused.status.message == refused.message and refused.message


async def test_a_planner_that_is_not_there_is_unreachable() -> None:
    """Nothing listening is `Unreachable`, naming the address, after the bounded retries."""
    address = f"127.0.0.1:{free_port()}"
    async with AsyncPlannerClient(address) as planner:
        with pytest.raises(Unreachable) as caught:
            await planner.describe_model(planner_pb2.DescribeModelRequest(source="hf://a/b"))
    assert caught.value.address == address
    assert caught.value.code == "UNAVAILABLE"
    assert str(caught.value) == f"the planner at {address} did not answer (UNAVAILABLE)"


class FlakyPlanner(planner_pb2_grpc.PlannerServiceServicer):
    """A planner whose DescribeModel fails with `code` for its first `failures` calls."""

    def __init__(self, code: grpc.StatusCode, failures: int, reason: str = "") -> None:
        self.code = code
        self.failures = failures
        self.reason = reason
        self.calls = 0
        self.port = 0

    async def DescribeModel(
        self, request: planner_pb2.DescribeModelRequest, context: Any
    ) -> planner_pb2.DescribeModelResponse:
        """Fail on cue, then answer a fixed version."""
        self.calls += 1
        if self.calls <= self.failures and self.reason:
            status = build_status(self.code, self.reason, "test", f"failure {self.calls}", {})
            await context.abort_with_status(rpc_status.to_status(status))
        if self.calls <= self.failures:
            await context.abort(self.code, f"failure {self.calls}")
        return planner_pb2.DescribeModelResponse(llamacpp_version="b1")


@contextlib.asynccontextmanager
async def flaky_planner(
    code: grpc.StatusCode, failures: int, reason: str = ""
) -> AsyncIterator[FlakyPlanner]:
    """A FlakyPlanner served on 127.0.0.1:PORT (its `port` attribute)."""
    # The RPCs it does not script answer UNIMPLEMENTED (the generated base class's).
    servicer = FlakyPlanner(code, failures, reason)  # type: ignore[abstract]
    server = grpc.aio.server()
    planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server)
    servicer.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("code", "failures", "calls", "answered"),
    [
        (grpc.StatusCode.UNAVAILABLE, RETRY_ATTEMPTS - 1, RETRY_ATTEMPTS, True),
        (grpc.StatusCode.UNAVAILABLE, RETRY_ATTEMPTS, RETRY_ATTEMPTS, False),
        (grpc.StatusCode.INTERNAL, 1, 1, False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 1, 1, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 1, 1, False),
    ],
)
async def test_only_unavailable_is_tried_again_and_only_so_often(
    code: grpc.StatusCode, failures: int, calls: int, answered: bool
) -> None:
    """UNAVAILABLE is retried up to RETRY_ATTEMPTS calls in all; INTERNAL, DEADLINE_EXCEEDED
    and any refusal are asked once."""
    async with flaky_planner(code, failures) as servicer:
        async with AsyncPlannerClient(f"127.0.0.1:{servicer.port}") as planner:
            request = planner_pb2.DescribeModelRequest(source="x")
            if answered:
                assert (await planner.describe_model(request)).llamacpp_version == "b1"
            else:
                with pytest.raises((Refused, Unreachable)) as caught:
                    await planner.describe_model(request)
                failure = caught.value
                assert isinstance(failure, Refused | Unreachable)
                assert failure.code == code.name
                assert isinstance(failure, Unreachable) == (code in UNREACHABLE_CODES)
                if isinstance(failure, Refused):
                    # A bare abort carries no ErrorInfo: no reason, not an empty one.
                    assert failure.reason is None and failure.metadata is None
        assert servicer.calls == calls


async def test_unavailable_with_a_reason_is_the_dependency_behind_the_server() -> None:
    """UNAVAILABLE sent with an ErrorInfo (a server whose own dependency did not answer) is
    `Unreachable` carrying that reason and message, and retried like any UNAVAILABLE."""
    async with (
        flaky_planner(grpc.StatusCode.UNAVAILABLE, 9, "PLANNER_UNAVAILABLE") as servicer,
        AsyncPlannerClient(f"127.0.0.1:{servicer.port}") as planner,
    ):
        with pytest.raises(Unreachable) as caught:
            await planner.describe_model(planner_pb2.DescribeModelRequest(source="x"))
    assert caught.value.reason == "PLANNER_UNAVAILABLE"
    assert caught.value.detail == f"failure {RETRY_ATTEMPTS}"
    assert servicer.calls == RETRY_ATTEMPTS


class ScriptedFleet(fleet_pb2_grpc.FleetServiceServicer):
    """A fleet whose WatchRollout plays `streams` in turn: each a list of event seqs, then the
    code it ends with (None: it ends cleanly); CreateModel fails UNAVAILABLE once."""

    def __init__(self, streams: list[tuple[list[int], grpc.StatusCode | None]]) -> None:
        self.streams = streams
        self.watches: list[int] = []
        self.request_ids: list[str] = []

    def WatchRollout(
        self, request: fleet_pb2.WatchRolloutRequest, context: Any
    ) -> Iterator[fleet_pb2.WatchRolloutResponse]:
        """The next scripted stream, recording where the client resumed."""
        self.watches.append(request.after_seq)
        seqs, end = self.streams[min(len(self.watches), len(self.streams)) - 1]
        for seq in seqs:
            yield fleet_pb2.WatchRolloutResponse(
                rollout_id=request.id, seq=seq, kind=fleet_pb2.ROLLOUT_EVENT_KIND_STEP_DONE
            )
        if end is not None:
            context.abort(end, "the stream is cut")

    def GetRollout(
        self, request: fleet_pb2.GetRolloutRequest, context: Any
    ) -> fleet_pb2.GetRolloutResponse:
        """The rollout, done."""
        return fleet_pb2.GetRolloutResponse(
            rollout=fleet_pb2.Rollout(id=request.id, state=fleet_pb2.ROLLOUT_STATE_SUCCEEDED)
        )

    def CreateModel(
        self, request: fleet_pb2.CreateModelRequest, context: Any
    ) -> fleet_pb2.CreateModelResponse:
        """UNAVAILABLE the first time, then the model as created."""
        self.request_ids.append(request.request_id)
        if len(self.request_ids) == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return fleet_pb2.CreateModelResponse(model=fleet_pb2.CatalogModel(model=request.model))


@contextlib.contextmanager
def scripted_fleet(fleet: ScriptedFleet) -> Iterator[str]:
    """`fleet` served on a blocking gRPC server; its address. The RPCs it does not script
    answer UNIMPLEMENTED (the generated base class's)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    fleet_pb2_grpc.add_FleetServiceServicer_to_server(fleet, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


class FakeTime:
    """A monotonic clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        """Move the clock on."""
        self.slept.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        """Now."""
        return self.now


def _watch(fleet: ScriptedFleet) -> tuple[list[int], FakeTime]:
    clock = FakeTime()
    with (
        scripted_fleet(fleet) as address,
        FleetClient(address, sleep=clock.sleep, monotonic=clock.monotonic) as client,
    ):
        return [e.seq for e in client.watch_rollout("ro-1")], clock


def test_a_dropped_watch_resumes_after_the_last_event() -> None:
    """A stream cut with UNAVAILABLE is opened again after the last event seen; no event is
    lost or repeated."""
    fleet = ScriptedFleet([([1, 2], grpc.StatusCode.UNAVAILABLE), ([3], None)])  # type: ignore[abstract]
    seqs, _clock = _watch(fleet)
    assert seqs == [1, 2, 3]
    assert fleet.watches == [0, 2]


def test_a_watch_ends_at_once_on_internal() -> None:
    """INTERNAL ends the watch with `Refused` after the events before it, never retried."""
    fleet = ScriptedFleet([([1], grpc.StatusCode.INTERNAL)])  # type: ignore[abstract]
    clock = FakeTime()
    with (
        scripted_fleet(fleet) as address,
        FleetClient(address, sleep=clock.sleep, monotonic=clock.monotonic) as client,
    ):
        seen = []
        with pytest.raises(Refused) as caught:
            for event in client.watch_rollout("ro-1"):
                seen.append(event.seq)
    assert seen == [1]
    assert caught.value.code == "INTERNAL"
    assert fleet.watches == [0]


def test_a_watch_that_cannot_resume_gives_up_after_its_allowance() -> None:
    """A fleet that keeps cutting the stream before any event is `Unreachable` once the
    watch has failed for RESUME_FOR_S."""
    fleet = ScriptedFleet([([], grpc.StatusCode.UNAVAILABLE)])  # type: ignore[abstract]
    with pytest.raises(Unreachable):
        _watch(fleet)
    # One attempt at the first failure, then one each RECONNECT_S until the allowance is spent.
    assert len(fleet.watches) == round(RESUME_FOR_S / RECONNECT_S) + 1


def test_a_retried_write_carries_the_same_request_id() -> None:
    """A CreateModel retried after UNAVAILABLE sends the request id of its first attempt, so
    the fleet can answer it as the first."""
    fleet = ScriptedFleet([])  # type: ignore[abstract]
    clock = FakeTime()
    with (
        scripted_fleet(fleet) as address,
        FleetClient(address, caller="tester", sleep=clock.sleep) as client,
    ):
        answer = client.create_model(model_from_data({"name": "m"}))
    assert answer.model.model.name == "m"
    assert len(fleet.request_ids) == 2 and fleet.request_ids[0] == fleet.request_ids[1]
    assert fleet.request_ids[0]


def test_a_fleet_that_is_not_there_is_unreachable() -> None:
    """With nothing listening, a fleet call is `Unreachable` naming the fleet and address."""
    address = f"127.0.0.1:{free_port()}"
    with FleetClient(address, sleep=lambda _s: None) as client, pytest.raises(Unreachable) as c:
        client.list_models()
    assert str(c.value) == f"the fleet at {address} did not answer (UNAVAILABLE)"
