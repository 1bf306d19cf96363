"""What a failed call to an llmgw service means to its caller: `Unreachable` (nobody answered)
or `Refused` (a server answered no, with its reason and facts).

This is the one place a gRPC transport error is looked at. Every client in `llmgw.clients`
(and the node agent's stream to the fleet) turns a `grpc.RpcError` into one of these two here,
decoding the `google.rpc.Status` and its `ErrorInfo` (written by `llmgw.rpc.status`) once.

Which codes mean what:
- UNAVAILABLE and DEADLINE_EXCEEDED are `Unreachable`: no answer came (nothing listens, the
  connection dropped, or the server took longer than the caller would wait), or the server
  says with a reason that a service behind it did not answer (the fleet's planner).
- Every other code is `Refused`, INTERNAL included: a server answered. INTERNAL is a server's
  bug reported as such (`llmgw.rpc.status.INTERNAL`); asking again asks the same bug.

Which are retried: UNAVAILABLE only, at most RETRY_ATTEMPTS times in all, RETRY_BACKOFF_S
apart. gRPC documents UNAVAILABLE as "most likely a transient condition, which can be
corrected by retrying with a backoff" (grpc.io/docs/guides/status-codes); here it is a dropped
connection or a server restarting. Retrying is safe because every planner call is a read and
every fleet write carries a request id fixed before the first attempt, which the fleet answers
a second time with its first answer. DEADLINE_EXCEEDED is not retried: the caller's time is
spent. A server that is down costs the few tenths of a second of the backoff, then is
`Unreachable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2

T = TypeVar("T")

UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Codes that mean no answer came."""
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
"""Codes a unary call is tried again on (see the module's docstring for why only this one)."""
_RETRIED_NAMES = frozenset(c.name for c in RETRIED_CODES)
RETRY_ATTEMPTS = 3
"""Attempts of a unary call in all, the first included."""
RETRY_BACKOFF_S = (0.1, 0.3)
"""The wait before the second and the third attempt."""
_DETAILS_KEY = "grpc-status-details-bin"
"""The trailing metadata key a `google.rpc.Status` travels under (gRPC's rich error model,
as grpc_status.rpc_status reads it)."""


class ClientError(Exception):
    """The root of what a call to an llmgw service fails with."""


@dataclass
class Unreachable(ClientError):
    """No answer came from the service at `address`, or it answered that what it depends on
    did not (then `reason` is set); nothing is known to have changed.

    Attributes:
        address: HOST:PORT that was called.
        detail: gRPC's own words for what happened (connection refused, deadline, ...), or
            the service's message when it gave a reason.
        service: which service it is ("planner", "fleet"), for messages.
        code: UNAVAILABLE or DEADLINE_EXCEEDED.
        reason: the ErrorInfo reason of a service that answered UNAVAILABLE itself (the fleet's
            PLANNER_UNAVAILABLE: the planner behind it did not answer); None when nobody did.
    """

    address: str
    detail: str
    service: str = "service"
    code: str = "UNAVAILABLE"
    reason: str | None = None

    def __post_init__(self) -> None:
        super().__init__(f"the {self.service} at {self.address} did not answer ({self.code})")


@dataclass
class Refused(ClientError):
    """The service answered with an error status.

    Attributes:
        reason: the `ErrorInfo` reason (e.g. STALE_REVISION); None when the status carried no
            ErrorInfo (a bare abort, or INTERNAL).
        message: the status message: one sentence for people.
        metadata: the `ErrorInfo` facts; None when there was no ErrorInfo.
        code: the gRPC code's name (e.g. ABORTED).
        status: the whole `google.rpc.Status`, for a server passing a refusal on unchanged.
    """

    reason: str | None
    message: str
    metadata: dict[str, str] | None
    code: str
    status: status_pb2.Status = field(default_factory=status_pb2.Status, repr=False)

    def __post_init__(self) -> None:
        super().__init__(self.message)


def decode(err: grpc.RpcError, service: str, address: str) -> Unreachable | Refused:
    """What a failed call means, from the error gRPC raised for it (sync or asyncio).

    Args:
        err: the error a stub raised (a `grpc.Call` or `grpc.aio.AioRpcError`).
        service: the service called, for messages ("planner", "fleet").
        address: the HOST:PORT called.
    """
    code = _code(err)
    details = _details(err)
    status = _rich_status(err)
    if status is None:
        status = status_pb2.Status(code=code.value[0], message=details)
    reason, metadata = _error_info(status)
    if code in UNREACHABLE_CODES:
        return Unreachable(
            address=address, detail=details, service=service, code=code.name, reason=reason
        )
    return Refused(reason=reason, message=details, metadata=metadata, code=code.name, status=status)


def _error_info(status: status_pb2.Status) -> tuple[str | None, dict[str, str] | None]:
    """The reason and metadata of the status's first ErrorInfo; (None, None) without one."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, dict(info.metadata)
    return None, None


def retried(failure: grpc.RpcError | ClientError) -> bool:
    """Whether a call that failed so is tried again: UNAVAILABLE only."""
    if isinstance(failure, ClientError):
        return isinstance(failure, Unreachable) and failure.code in _RETRIED_NAMES
    return _code(failure) in RETRIED_CODES


def _code(err: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(err, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    value = details() if callable(details) else None
    return value if isinstance(value, str) else ""


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    """The `google.rpc.Status` in the call's trailing metadata, when its code agrees with the
    call's (a status that disagrees is not trusted, as grpc_status.rpc_status refuses it)."""
    trailing = getattr(err, "trailing_metadata", None)
    pairs = trailing() if callable(trailing) else None
    for key, value in pairs or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            return status if status.code == _code(err).value[0] else None
    return None


def call(
    fn: Callable[[], T],
    service: str,
    address: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run one unary call, trying again on UNAVAILABLE (bounded, see the module docstring).

    Raises:
        Unreachable, Refused: the last attempt's failure.
    """
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return fn()
        except grpc.RpcError as err:
            if not retried(err) or attempt + 1 == RETRY_ATTEMPTS:
                raise decode(err, service, address) from err
        sleep(RETRY_BACKOFF_S[attempt])
    raise AssertionError("the last attempt returns or raises")


async def call_async(
    fn: Callable[[], Awaitable[T]],
    service: str,
    address: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`call` for grpc.aio stubs."""
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return await fn()
        except grpc.RpcError as err:
            if not retried(err) or attempt + 1 == RETRY_ATTEMPTS:
                raise decode(err, service, address) from err
        await sleep(RETRY_BACKOFF_S[attempt])
    raise AssertionError("the last attempt returns or raises")


@contextmanager
def translated(service: str, address: str) -> Iterator[None]:
    """Inside it, a gRPC error (a stream's, say) is raised as `Unreachable` or `Refused`;
    nothing is retried."""
    try:
        yield
    except grpc.RpcError as err:
        raise decode(err, service, address) from err


@asynccontextmanager
async def translated_async(service: str, address: str) -> AsyncIterator[None]:
    """`translated` for code that awaits grpc.aio calls and streams."""
    try:
        yield
    except grpc.RpcError as err:
        raise decode(err, service, address) from err
