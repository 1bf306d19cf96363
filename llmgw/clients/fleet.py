"""The fleet's client, for blocking code (the command line, `llmgw up`, the demo).

Who calls is the channel's client certificate (`tls`) or a bearer token (`token`); a call may
also name a caller in the `x-llmgw-caller` metadata, which the fleet records only from an
identity allowed to act for others (the gateway). Every call fails with `Unreachable` or
`Refused` (llmgw.clients.errors). Unary calls are retried on UNAVAILABLE only; every write
carries a request id fixed before its first attempt, so a retry is answered with the first
answer. A rollout's watch resumes after a dropped stream for up to
RESUME_FOR_S, from the last event it saw.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TypeVar

import grpc

from llmgw.clients.auth import bearer_metadata
from llmgw.clients.convert import Model, ReplicaEvent, Rollout, RolloutEvent
from llmgw.clients.errors import Unreachable, call, retried, translated
from llmgw.clients.planner import CHANNEL_OPTIONS
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.tls import ClientTLS, sync_channel

SERVICE = "fleet"
CALLER_KEY = "x-llmgw-caller"
"""Metadata naming whom a call is made for (honoured from the gateway's identity only)."""
DEFAULT_TIMEOUT_S = 15.0
RESUME_FOR_S = 60.0
"""How long a rollout's watch keeps trying to resume after its stream dropped (a fleet
restarting takes seconds); an event received starts the allowance afresh."""
RECONNECT_S = 1.0
"""The wait between two attempts to resume a watch."""
STRATEGIES: dict[str, fleet_pb2.Strategy.ValueType] = {
    "beside": fleet_pb2.STRATEGY_BESIDE,
    "in-place": fleet_pb2.STRATEGY_IN_PLACE,
    "auto": fleet_pb2.STRATEGY_AUTO,
}
"""A rollout's strategies by the names people give them."""

T = TypeVar("T")


def new_request_id() -> str:
    """A fresh request id: the fleet answers a retry of it with the first answer."""
    return uuid.uuid4().hex


class FleetClient:
    """The fleet at `address`. Close it (or use `with`).

    Args:
        address: HOST:PORT.
        caller: whom the calls are made for, sent as `x-llmgw-caller` ("" sends no name).
        timeout_s: how long each unary call waits for its answer.
        tls: the CA to trust and the client pair to present; None speaks plaintext.
        token: a bearer token sent with every call (`authorization` metadata); "" sends none.
        sleep: how to wait between attempts (tests pass a fake).
        monotonic: the clock a watch's resume allowance is measured on.

    Raises:
        TLSConfigError: a TLS file cannot be read.
        ValueError: the token cannot travel as a header value.
    """

    def __init__(
        self,
        address: str,
        caller: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        tls: ClientTLS | None = None,
        token: str = "",
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.metadata: tuple[tuple[str, str], ...] = (
            ((CALLER_KEY, caller),) if caller else ()
        ) + bearer_metadata(token)
        self._sleep = sleep
        self._monotonic = monotonic
        self._secure = tls is not None
        # A change's answer carries its profiles' arguments before and after, as the
        # planner's does: the same receive limit.
        self._channel = sync_channel(address, tls, CHANNEL_OPTIONS)
        self._stub = fleet_pb2_grpc.FleetServiceStub(self._channel)

    def _call(self, fn: Callable[[], T]) -> T:
        return call(fn, SERVICE, self.address, sleep=self._sleep, secure=self._secure)

    # -- the catalog ---------------------------------------------------------------------

    def list_models(self) -> fleet_pb2.ListModelsResponse:
        """Every model of the catalog."""
        request = fleet_pb2.ListModelsRequest()
        return self._call(
            lambda: self._stub.ListModels(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def get_model(self, name: str) -> fleet_pb2.CatalogModel:
        """One model of the catalog, with its revision, etag and author."""
        request = fleet_pb2.GetModelRequest(name=name)
        return self._call(
            lambda: self._stub.GetModel(request, timeout=self.timeout_s, metadata=self.metadata)
        ).model

    def create_model(self, model: Model, request_id: str = "") -> fleet_pb2.CreateModelResponse:
        """Add a model to the catalog."""
        request = fleet_pb2.CreateModelRequest(
            model=model, request_id=request_id or new_request_id()
        )
        return self._call(
            lambda: self._stub.CreateModel(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def update_model(
        self, model: Model, etag: str = "", request_id: str = ""
    ) -> fleet_pb2.UpdateModelResponse:
        """Replace a model of the catalog; refused unless it is still at `etag` (when given)."""
        request = fleet_pb2.UpdateModelRequest(
            model=model, etag=etag, request_id=request_id or new_request_id()
        )
        return self._call(
            lambda: self._stub.UpdateModel(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def delete_model(
        self, name: str, etag: str = "", request_id: str = ""
    ) -> fleet_pb2.DeleteModelResponse:
        """Remove a model; its replicas are drained and stopped."""
        request = fleet_pb2.DeleteModelRequest(
            name=name, etag=etag, request_id=request_id or new_request_id()
        )
        return self._call(
            lambda: self._stub.DeleteModel(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def list_model_revisions(self, name: str) -> fleet_pb2.ListModelRevisionsResponse:
        """Every revision of a model, oldest first."""
        request = fleet_pb2.ListModelRevisionsRequest(name=name)
        return self._call(
            lambda: self._stub.ListModelRevisions(
                request, timeout=self.timeout_s, metadata=self.metadata
            )
        )

    # -- nodes and replicas --------------------------------------------------------------

    def list_nodes(self) -> fleet_pb2.ListNodesResponse:
        """The nodes whose agents connected."""
        request = fleet_pb2.ListNodesRequest()
        return self._call(
            lambda: self._stub.ListNodes(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def list_replicas(self, model: str = "") -> fleet_pb2.ListReplicasResponse:
        """The replicas (of `model` alone, when given)."""
        request = fleet_pb2.ListReplicasRequest(model=model)
        return self._call(
            lambda: self._stub.ListReplicas(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def watch_replicas(self, model: str = "") -> Generator[ReplicaEvent, None, None]:
        """The ready endpoints, then SYNCED, then each change, until the stream ends or the
        iterator is closed (which cancels the stream). Not resumed when it drops."""
        stream = self._stub.WatchReplicas(
            fleet_pb2.WatchReplicasRequest(model=model), metadata=self.metadata
        )
        try:
            with translated(SERVICE, self.address, secure=self._secure):
                yield from stream
        finally:
            stream.cancel()

    # -- changes and rollouts ------------------------------------------------------------

    def set_gpus(
        self,
        name: str,
        gpus: int,
        *,
        profile: str = "",
        in_place: bool = False,
        dry_run: bool = False,
        request_id: str = "",
        etag: str = "",
        strategy: str = "",
        supersede: bool = False,
        surge: int = 0,
    ) -> fleet_pb2.SetGPUsResponse:
        """Plan `gpus` cards a replica for a model's GPU profiles and roll it out.

        Args:
            strategy: a name of STRATEGIES, or "" for the fleet's default.
        """
        request = fleet_pb2.SetGPUsRequest(
            name=name,
            gpus=gpus,
            profile=profile,
            in_place=in_place,
            dry_run=dry_run,
            request_id=request_id or new_request_id(),
            etag=etag,
            strategy=STRATEGIES.get(strategy, fleet_pb2.STRATEGY_UNSPECIFIED),
            supersede=supersede,
            surge=surge,
        )
        return self._call(
            lambda: self._stub.SetGPUs(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def set_context(
        self,
        name: str,
        tokens: int,
        *,
        slots: int = 0,
        dry_run: bool = False,
        request_id: str = "",
        etag: str = "",
        strategy: str = "",
        supersede: bool = False,
        surge: int = 0,
    ) -> fleet_pb2.SetContextResponse:
        """Size a new context for a model and roll it out.

        Args:
            strategy: a name of STRATEGIES, or "" for the fleet's default.
        """
        request = fleet_pb2.SetContextRequest(
            name=name,
            tokens=tokens,
            slots=slots,
            dry_run=dry_run,
            request_id=request_id or new_request_id(),
            etag=etag,
            strategy=STRATEGIES.get(strategy, fleet_pb2.STRATEGY_UNSPECIFIED),
            supersede=supersede,
            surge=surge,
        )
        return self._call(
            lambda: self._stub.SetContext(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def list_rollouts(self, model: str = "") -> list[Rollout]:
        """Rollouts, newest first (of `model` alone, when given)."""
        request = fleet_pb2.ListRolloutsRequest(model=model)
        answer = self._call(
            lambda: self._stub.ListRollouts(request, timeout=self.timeout_s, metadata=self.metadata)
        )
        return list(answer.rollouts)

    def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout and its steps."""
        request = fleet_pb2.GetRolloutRequest(id=rollout_id)
        return self._call(
            lambda: self._stub.GetRollout(request, timeout=self.timeout_s, metadata=self.metadata)
        ).rollout

    def cancel_rollout(self, rollout_id: str, request_id: str = "") -> Rollout:
        """Stop a running rollout; the old replicas keep serving."""
        request = fleet_pb2.CancelRolloutRequest(
            id=rollout_id, request_id=request_id or new_request_id()
        )
        return self._call(
            lambda: self._stub.CancelRollout(
                request, timeout=self.timeout_s, metadata=self.metadata
            )
        ).rollout

    def undo_rollout(
        self, rollout_id: str, *, dry_run: bool = False, request_id: str = ""
    ) -> fleet_pb2.UndoRolloutResponse:
        """Roll a model back to its revision before a rollout (itself rolled out)."""
        request = fleet_pb2.UndoRolloutRequest(
            id=rollout_id, request_id=request_id or new_request_id(), dry_run=dry_run
        )
        return self._call(
            lambda: self._stub.UndoRollout(request, timeout=self.timeout_s, metadata=self.metadata)
        )

    def watch_rollout(
        self, rollout_id: str, after_seq: int = 0
    ) -> Generator[RolloutEvent, None, None]:
        """A rollout's events after `after_seq`, until it ends.

        A stream that drops with UNAVAILABLE is opened again after RECONNECT_S, resuming
        after the last event seen, until it has failed for RESUME_FOR_S without an event in
        between; any other failure (INTERNAL included) ends the watch at once.

        Raises:
            Unreachable: the stream could not be resumed within RESUME_FOR_S.
            Refused: the fleet refused the watch (no such rollout, INTERNAL, ...).
        """
        seq = after_seq
        failing_since: float | None = None
        while True:
            stream = self._stub.WatchRollout(
                fleet_pb2.WatchRolloutRequest(id=rollout_id, after_seq=seq),
                metadata=self.metadata,
            )
            try:
                with translated(SERVICE, self.address, secure=self._secure):
                    for event in stream:
                        seq = event.seq
                        failing_since = None
                        yield event
                return
            except Unreachable as failure:
                now = self._monotonic()
                failing_since = now if failing_since is None else failing_since
                if not retried(failure) or now - failing_since >= RESUME_FOR_S:
                    raise
            finally:
                stream.cancel()
            self._sleep(RECONNECT_S)

    def wait_connected(self, timeout_s: float, stop: threading.Event) -> bool:
        """Wait until the channel connects, in slices so `stop` is not held up; False when
        `stop` was set first.

        Raises:
            Unreachable: it did not connect within `timeout_s`.
        """
        ready = grpc.channel_ready_future(self._channel)
        deadline = self._monotonic() + timeout_s
        try:
            while not stop.is_set():
                try:
                    ready.result(timeout=0.25)
                    return True
                except grpc.FutureTimeoutError:
                    if self._monotonic() > deadline:
                        raise Unreachable(
                            address=self.address,
                            detail=f"could not connect within {timeout_s:.0f} s",
                            service=SERVICE,
                        ) from None
            return False
        finally:
            ready.cancel()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
