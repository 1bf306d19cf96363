"""The planner's clients: `PlannerClient` (blocking, for the command line) and
`AsyncPlannerClient` (grpc.aio, for the fleet). Both fail with `Unreachable` or `Refused`
(llmgw.clients.errors), retrying UNAVAILABLE only; every planner call is a read. Channels are
made by llmgw.tls: TLS with a `ClientTLS`, plaintext without."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from llmgw.clients import service_config
from llmgw.clients.auth import bearer_metadata
from llmgw.clients.convert import (
    DescribeModelAnswer,
    Inventory,
    Model,
    PlanGPUsAnswer,
    SizeContextAnswer,
)
from llmgw.clients.errors import call, call_async
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.tls import ClientTLS, aio_channel, sync_channel

T = TypeVar("T")

SERVICE = "planner"
DEFAULT_TIMEOUT_S = 60.0
"""How long a call waits for its answer: a cold Hugging Face fetch behind DescribeModel can be
slow."""

ANSWER_BYTES = 64 << 20
"""The largest answer a client takes (gRPC's default is 4 MiB): an answer carries each profile's
arguments before and after, so it can be a few times its request, which the planner holds to
4 MiB by default (llmgw.limits)."""
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", ANSWER_BYTES),
    *service_config.CHANNEL_OPTIONS,
]
"""Every client channel's options: the answers' size limit and the published service config."""


class PlannerClient:
    """The planner at `address`, called from blocking code. Close it (or use `with`).

    Args:
        address: HOST:PORT.
        timeout_s: how long each call waits for its answer.
        tls: the CA to trust and the client pair to present; None speaks plaintext.
        token: a bearer token sent with every call (`authorization` metadata); "" sends none.

    Raises:
        TLSConfigError: a TLS file cannot be read.
        ValueError: the token cannot travel as a header value.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        tls: ClientTLS | None = None,
        token: str = "",
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.metadata = bearer_metadata(token)
        self._secure = tls is not None
        self._channel = sync_channel(address, tls, CHANNEL_OPTIONS)
        self._stub = planner_pb2_grpc.PlannerServiceStub(self._channel)

    def _call(self, fn: Callable[[], T]) -> T:
        return call(fn, SERVICE, self.address, secure=self._secure)

    def describe_model(self, source: str) -> DescribeModelAnswer:
        """A model's resolved shape, from its source (GGUF URL or path, hf://ORG/NAME)."""
        request = planner_pb2.DescribeModelRequest(source=source)
        return self._call(
            lambda: self._stub.DescribeModel(
                request, timeout=self.timeout_s, metadata=self.metadata
            )
        )

    def size_context(
        self,
        model: Model,
        tokens: int,
        *,
        slots: int = 0,
        sequences: int = 0,
        inventory: Inventory | None = None,
    ) -> SizeContextAnswer:
        """The change serving `tokens` a request would make to `model`'s profiles; with
        `sequences` > 0, also whether that many concurrent requests of `tokens` fit (the
        answer's `batches`, one per profile sized)."""
        request = planner_pb2.SizeContextRequest(
            model=model, tokens=tokens, slots=slots, sequences=sequences, inventory=inventory
        )
        return self._call(
            lambda: self._stub.SizeContext(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def plan_gpus(
        self,
        model: Model,
        gpus: int,
        *,
        profile: str = "",
        sequences: int = 0,
        inventory: Inventory | None = None,
    ) -> PlanGPUsAnswer:
        """The change `gpus` cards a replica would make to `model`'s GPU profiles (or to
        `profile` alone); with `sequences` > 0, also whether that many concurrent requests at
        each profile's context fit (the answer's `batches`)."""
        request = planner_pb2.PlanGPUsRequest(
            model=model, gpus=gpus, profile=profile, sequences=sequences, inventory=inventory
        )
        return self._call(
            lambda: self._stub.PlanGPUs(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncPlannerClient:
    """The planner at `address`, called from asyncio code (the fleet's SetContext and
    SetGPUs). It takes the requests whole: the fleet fills them from its catalog and inventory.

    Args:
        address: HOST:PORT.
        timeout_s: how long each call waits for its answer.
        tls: the CA to check the planner against and the fleet's client pair; None for a
            plaintext channel.

    Raises:
        TLSConfigError: a TLS file cannot be read.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        tls: ClientTLS | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = aio_channel(address, tls, CHANNEL_OPTIONS)
        self._stub = planner_pb2_grpc.PlannerServiceStub(self._channel)

    async def size_context(
        self, request: planner_pb2.SizeContextRequest
    ) -> planner_pb2.SizeContextResponse:
        """SizeContext.

        Raises:
            Unreachable, Refused: as llmgw.clients.errors says.
        """
        answer = await call_async(
            lambda: self._stub.SizeContext(request, timeout=self.timeout_s),
            SERVICE,
            self.address,
        )
        return answer

    async def plan_gpus(self, request: planner_pb2.PlanGPUsRequest) -> planner_pb2.PlanGPUsResponse:
        """PlanGPUs.

        Raises:
            Unreachable, Refused: as llmgw.clients.errors says.
        """
        answer = await call_async(
            lambda: self._stub.PlanGPUs(request, timeout=self.timeout_s),
            SERVICE,
            self.address,
        )
        return answer

    async def describe_model(
        self, request: planner_pb2.DescribeModelRequest
    ) -> planner_pb2.DescribeModelResponse:
        """DescribeModel.

        Raises:
            Unreachable, Refused: as llmgw.clients.errors says.
        """
        answer = await call_async(
            lambda: self._stub.DescribeModel(request, timeout=self.timeout_s),
            SERVICE,
            self.address,
        )
        return answer

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncPlannerClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
