"""The fleet's `Planner` over gRPC: requests built from the fleet's values, answers read back
into them, and the one place a planner call's transport error is decided on."""

from __future__ import annotations

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from fleet_svc.domain import errors
from fleet_svc.domain.catalog import Entry
from fleet_svc.planner import Planned
from fleet_svc.rpc.convert import inventory_to_proto, model_to_proto
from fleet_svc.rpc.status import PlannerRefused
from llmgw.model import Inventory
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.rpc.common import profile_from_proto

PLANNER_TIMEOUT_S = 60.0
"""How long the fleet waits for the planner (a cold Hugging Face fetch can be slow)."""


class GrpcPlanner:
    """The planner at `address`; its refusals are passed on unchanged."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = planner_pb2_grpc.PlannerServiceStub(self._channel)
        self.address = address

    def _failed(self, err: grpc.aio.AioRpcError) -> Exception:
        """What a failed call becomes: unavailable (nothing changed, retry) or the refusal."""
        if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return errors.PlannerUnavailable(
                f"the planner at {self.address} did not answer ({err.code().name}); nothing "
                "changed: try again"
            )
        status = rpc_status.from_call(err)
        if status is None:
            status = status_pb2.Status(code=err.code().value[0], message=err.details() or "")
        return PlannerRefused(status)

    async def size_context(
        self, entry: Entry, inventory: Inventory, *, tokens: int, slots: int
    ) -> Planned:
        """SizeContext on the planner."""
        request = planner_pb2.SizeContextRequest(
            model=model_to_proto(entry),
            tokens=tokens,
            slots=slots,
            inventory=inventory_to_proto(inventory),
        )
        try:
            answer = await self._stub.SizeContext(request, timeout=PLANNER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise self._failed(err) from err
        return Planned(
            profiles=tuple(profile_from_proto(p, i) for i, p in enumerate(answer.profiles)),
            report=answer.change,
            context_length=answer.change.after,
            max_output=answer.change.max_output,
        )

    async def plan_gpus(
        self, entry: Entry, inventory: Inventory, *, gpus: int, profile: str
    ) -> Planned:
        """PlanGPUs on the planner."""
        request = planner_pb2.PlanGPUsRequest(
            model=model_to_proto(entry),
            gpus=gpus,
            profile=profile,
            inventory=inventory_to_proto(inventory),
        )
        try:
            answer = await self._stub.PlanGPUs(request, timeout=PLANNER_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise self._failed(err) from err
        return Planned(
            profiles=tuple(profile_from_proto(p, i) for i, p in enumerate(answer.profiles)),
            report=answer.change,
        )

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()
