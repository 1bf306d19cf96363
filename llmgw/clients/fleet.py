"""The fleet's client, for blocking code (the command line, `llmgw up`, the demo).

Who calls is the channel's client certificate (`tls`) or a bearer token (`token`); a call may
also name a caller in the `x-llmgw-caller` metadata, which the fleet records only from an
identity allowed to act for others (the gateway). Every call fails with `Unreachable` or
`Refused` (llmgw.clients.errors). Unary calls are retried on UNAVAILABLE only; every write
carries a request id fixed before its first attempt, so a retry is answered with the first
answer. A rollout's watch resumes after a dropped stream for up to
RESUME_FOR_S, from the last event it saw.

Given several fleet addresses (`a:1,b:1`, or a name resolving to several), the client finds
the leader itself (llmgw.clients.leader): a fleet that does not lead answers NOT_LEADER naming
the leader, and the client goes there; one that does not answer is passed over for the next.
While no fleet leads (an election, up to the lease and a renewal: about 8 s) it keeps asking,
for up to FIND_LEADER_S.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc

from llmgw.clients.auth import bearer_metadata
from llmgw.clients.convert import Model, ReplicaEvent, Rollout, RolloutEvent
from llmgw.clients.errors import (
    RETRY_ATTEMPTS,
    RETRY_BACKOFF_S,
    Unreachable,
    decode,
    retried,
    translated,
)
from llmgw.clients.leader import Fleets, fleet_addresses, not_leader
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
FIND_LEADER_S = 12.0
"""How long a call keeps looking for the leader while fleets answer NOT_LEADER: longer than
an election after a leader's death (its 6 s lease and a 2 s renewal, docs/fleet.md)."""
ELECTION_POLL_S = 0.5
"""The wait between two asks while no fleet names a leader."""
STRATEGIES: dict[str, fleet_pb2.Strategy.ValueType] = {
    "beside": fleet_pb2.STRATEGY_BESIDE,
    "in-place": fleet_pb2.STRATEGY_IN_PLACE,
    "auto": fleet_pb2.STRATEGY_AUTO,
    "canary": fleet_pb2.STRATEGY_CANARY,
}
"""A rollout's strategies by the names people give them."""


def canary_policy(fields: Mapping[str, Any] | None) -> fleet_pb2.CanaryPolicy | None:
    """A canary policy from its fields by their proto names (None: no canary asked)."""
    return None if fields is None else fleet_pb2.CanaryPolicy(**fields)


T = TypeVar("T")


def new_request_id() -> str:
    """A fresh request id: the fleet answers a retry of it with the first answer."""
    return uuid.uuid4().hex


class FleetClient:
    """The fleet at `address`. Close it (or use `with`).

    Args:
        address: HOST:PORT, or several separated by commas (fleets sharing one store: the
            client finds the one that leads), or a name resolving to several addresses.
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
        self._fleets = Fleets(fleet_addresses(address))
        self.timeout_s = timeout_s
        self.metadata: tuple[tuple[str, str], ...] = (
            ((CALLER_KEY, caller),) if caller else ()
        ) + bearer_metadata(token)
        self._sleep = sleep
        self._monotonic = monotonic
        self._secure = tls is not None
        self._tls = tls
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, fleet_pb2_grpc.FleetServiceStub] = {}
        self._stub  # noqa: B018 (the first channel now: a TLS file that cannot be read is said here)

    @property
    def address(self) -> str:
        """The fleet address calls go to now (the leader, once found)."""
        return self._fleets.current

    @property
    def _channel(self) -> grpc.Channel:
        self._stub  # noqa: B018 (opens the channel)
        return self._channels[self.address]

    @property
    def _stub(self) -> fleet_pb2_grpc.FleetServiceStub:
        address = self.address
        stub = self._stubs.get(address)
        if stub is None:
            # A change's answer carries its profiles' arguments before and after, as the
            # planner's does: the same receive limit.
            self._channels[address] = sync_channel(address, self._tls, CHANNEL_OPTIONS)
            stub = self._stubs[address] = fleet_pb2_grpc.FleetServiceStub(self._channels[address])
        return stub

    def _call(self, fn: Callable[[], T]) -> T:
        """One unary call: tried again on UNAVAILABLE (RETRY_ATTEMPTS per address known, with
        the usual backoff), at the leader a NOT_LEADER answer names or else the next address,
        and while fleets say none leads, every ELECTION_POLL_S for up to FIND_LEADER_S.

        Raises:
            Unreachable, Refused: the last attempt's failure.
        """
        deadline = self._monotonic() + FIND_LEADER_S
        plain = 0
        while True:
            try:
                return fn()
            except grpc.RpcError as err:
                failure = decode(err, SERVICE, self.address, secure=self._secure)
                if not retried(failure):
                    raise failure from err
                if not not_leader(failure):
                    plain += 1
                    if plain >= RETRY_ATTEMPTS * len(self._fleets.addresses):
                        raise failure from err
                elif self._monotonic() >= deadline:
                    raise failure from err
                if self._fleets.after(failure):
                    continue
                if not_leader(failure):
                    self._sleep(ELECTION_POLL_S)
                elif len(self._fleets.addresses) == 1 or plain % len(self._fleets.addresses) == 0:
                    self._sleep(RETRY_BACKOFF_S[min(plain // len(self._fleets.addresses), 2) - 1])

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
        self,
        model: Model,
        etag: str = "",
        request_id: str = "",
        *,
        dry_run: bool = False,
        strategy: str = "",
        supersede: bool = False,
        surge: int = 0,
        canary: Mapping[str, Any] | None = None,
    ) -> fleet_pb2.UpdateModelResponse:
        """Replace a model of the catalog, refused unless it is still at `etag` (when given);
        replicas that would run otherwise are replaced by a rollout (`rollout_id`).

        Args:
            strategy: a name of STRATEGIES, or "" for the fleet's default.
        """
        request = fleet_pb2.UpdateModelRequest(
            model=model,
            etag=etag,
            request_id=request_id or new_request_id(),
            dry_run=dry_run,
            strategy=STRATEGIES.get(strategy, fleet_pb2.STRATEGY_UNSPECIFIED),
            supersede=supersede,
            surge=surge,
            canary=canary_policy(canary),
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

    def watch_replicas(
        self, model: str = "", *, after_seq: int = 0, epoch: str = ""
    ) -> Generator[ReplicaEvent, None, None]:
        """The ready endpoints (or the events after `after_seq` of `epoch`), then SYNCED,
        then each change and heartbeats, until the stream ends or the iterator is closed
        (which cancels the stream). Not resumed when it drops: call again with the last
        `seq` and `epoch` seen."""
        stream = self._stub.WatchReplicas(
            fleet_pb2.WatchReplicasRequest(model=model, after_seq=after_seq, epoch=epoch),
            metadata=self.metadata,
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
        allow_unchecked: bool = False,
        canary: Mapping[str, Any] | None = None,
        sequences: int = 0,
    ) -> fleet_pb2.SetGPUsResponse:
        """Plan `gpus` cards a replica for a model's GPU profiles and roll it out.

        Args:
            strategy: a name of STRATEGIES, or "" for the fleet's default.
            allow_unchecked: apply the plan even when the planner could not read the model's
                shape (else PLAN_NOT_CHECKED).
            sequences: concurrent requests at each profile's context to size for (0: none);
                the answer's `batches` says whether they fit.
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
            allow_unchecked=allow_unchecked,
            canary=canary_policy(canary),
            sequences=sequences,
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
        allow_unchecked: bool = False,
        canary: Mapping[str, Any] | None = None,
        sequences: int = 0,
    ) -> fleet_pb2.SetContextResponse:
        """Size a new context for a model and roll it out.

        Args:
            strategy: a name of STRATEGIES, or "" for the fleet's default.
            allow_unchecked: as for set_gpus.
            sequences: concurrent requests of `tokens` each the context must fit (0: none),
                written to each engine's batch flag; the answer's `batches` says whether
                they fit.
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
            allow_unchecked=allow_unchecked,
            canary=canary_policy(canary),
            sequences=sequences,
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

    def promote_rollout(
        self, rollout_id: str, *, full: bool = False, request_id: str = ""
    ) -> Rollout:
        """Move a canary to its next step (or, `full`, past every step) without its analysis."""
        request = fleet_pb2.PromoteRolloutRequest(
            id=rollout_id, request_id=request_id or new_request_id(), full=full
        )
        return self._call(
            lambda: self._stub.PromoteRollout(
                request, timeout=self.timeout_s, metadata=self.metadata
            )
        ).rollout

    def undo_rollout(
        self,
        rollout_id: str,
        *,
        dry_run: bool = False,
        request_id: str = "",
        canary: Mapping[str, Any] | None = None,
    ) -> fleet_pb2.UndoRolloutResponse:
        """Roll a model back to its revision before a rollout (itself rolled out; as a canary
        with `canary`'s policy fields when given)."""
        request = fleet_pb2.UndoRolloutRequest(
            id=rollout_id,
            request_id=request_id or new_request_id(),
            dry_run=dry_run,
            canary=canary_policy(canary),
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
                # Any fleet answers a watch: resume at the next one (a leader named, or in turn).
                self._fleets.after(failure)
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
        """Close the channels."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
