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

A connection that failed in its TLS handshake is `Unreachable` too (UNAVAILABLE is what gRPC
says), with `tls` set to a sentence saying what went wrong and what to check, so a caller
prints that rather than gRPC's "failed to connect to all addresses".
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2

from llmgw.clients.service_config import retry_policy

T = TypeVar("T")

UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Codes that mean no answer came."""
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
"""Codes a unary call is tried again on (see the module's docstring for why only this one)."""
_RETRIED_NAMES = frozenset(c.name for c in RETRIED_CODES)
RETRY_ATTEMPTS, RETRY_BACKOFF_S = retry_policy()
"""Attempts of a unary call in all, the first included, and the wait before each attempt after
the first: the published service config's retry policy (llmgw/clients/service_config.json:
3 attempts, 0.1 s and 0.3 s apart)."""
_DETAILS_KEY = "grpc-status-details-bin"
"""The trailing metadata key a `google.rpc.Status` travels under (gRPC's rich error model,
as grpc_status.rpc_status reads it)."""


_HANDSHAKE = re.compile(r"handshake failed[^:]*:\s*(?P<why>.*)", re.IGNORECASE | re.DOTALL)
"""gRPC core's words for a handshake this side refused (`Tls handshake failed
(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:...:CERTIFICATE_VERIFY_FAILED: ...`)."""
_SSL_REASON = re.compile(r"OPENSSL_internal:(?P<reason>[A-Z_]+)(?::\s*(?P<text>[^:]+))?")
_CLOSED = "Socket closed"
"""What gRPC core says when the server hung up while the connection was being set up: a TLS
server does that to a plaintext client and to a client certificate it does not accept (the
server's side of the handshake; the client is told nothing more)."""
_TLS_WHY = {
    "CERTIFICATE_VERIFY_FAILED": "the server's certificate is not signed by the CA this client "
    "trusts",
    "WRONG_VERSION_NUMBER": "the server does not speak TLS (it serves plaintext)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the server requires a client certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "the server does not trust the CA that signed this client's "
    "certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server says this client's certificate expired",
}
"""BoringSSL's reasons, said for people."""


_WRONG_NAME = ("Hostname Verification Check failed", "not in peer certificate")
"""gRPC core's words for a server certificate that does not name the server name checked."""


def tls_problem(details: str, *, secure: bool | None = None, service: str = "") -> str:
    """A sentence for a connection that failed in or around its TLS handshake, "" for any
    other failure.

    Args:
        details: gRPC's details of an UNAVAILABLE call.
        secure: whether this client spoke TLS (None: not known), to say what a hang-up means.
        service: the service this client expects ("fleet", "planner"), for a certificate that
            names another.
    """
    if any(words in details for words in _WRONG_NAME):
        expected = f"the {service} ({service}.service.llmgw)" if service else "the name checked"
        return (
            f"refused the server's certificate: it does not name {expected}, so this is "
            "another service of the same CA (check the address), or a pair that names no "
            "service (give --tls-server-name HOST to check the host name instead)"
        )
    match = _HANDSHAKE.search(details)
    if match is not None:
        why = match.group("why").strip()
        ssl = _SSL_REASON.search(why)
        if ssl is not None:
            reason = ssl.group("reason")
            said = _TLS_WHY.get(reason) or (ssl.group("text") or reason).strip()
            why = f"{said} ({reason})"
        return f"TLS handshake failed: {why}"
    if _CLOSED in details:
        if secure is False:
            return (
                "the server closed the connection while it was being set up: it may require "
                "TLS (this client spoke plaintext)"
            )
        if secure:
            return (
                "the server closed the connection during the TLS handshake: it did not accept "
                "this client's certificate (none given, expired, or signed by another CA)"
            )
    return ""


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
        tls: what went wrong in the TLS handshake, for people (`tls_problem`); "" when the
            failure was not about TLS.
        metadata: the `ErrorInfo` facts of a service that answered UNAVAILABLE itself (a fleet
            that does not lead names the leader's address); None when nobody did.
    """

    address: str
    detail: str
    service: str = "service"
    code: str = "UNAVAILABLE"
    reason: str | None = None
    tls: str = ""
    metadata: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if self.tls:
            super().__init__(f"the {self.service} at {self.address}: {self.tls}")
        else:
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


def decode(
    err: grpc.RpcError, service: str, address: str, *, secure: bool | None = None
) -> Unreachable | Refused:
    """What a failed call means, from the error gRPC raised for it (sync or asyncio).

    Args:
        err: the error a stub raised (a `grpc.Call` or `grpc.aio.AioRpcError`).
        service: the service called, for messages ("planner", "fleet").
        address: the HOST:PORT called.
        secure: whether the channel spoke TLS (None: not known), for `tls_problem`.
    """
    code = _code(err)
    details = _details(err)
    status = _rich_status(err)
    if status is None:
        status = status_pb2.Status(code=code.value[0], message=details)
    reason, metadata = _error_info(status)
    if code in UNREACHABLE_CODES:
        tls = tls_problem(details, secure=secure, service=service) if reason is None else ""
        return Unreachable(
            address=address,
            detail=details,
            service=service,
            code=code.name,
            reason=reason,
            tls=tls,
            metadata=metadata,
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
    secure: bool | None = None,
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
                raise decode(err, service, address, secure=secure) from err
        sleep(RETRY_BACKOFF_S[attempt])
    raise AssertionError("the last attempt returns or raises")


async def call_async(
    fn: Callable[[], Awaitable[T]],
    service: str,
    address: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    secure: bool | None = None,
) -> T:
    """`call` for grpc.aio stubs."""
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return await fn()
        except grpc.RpcError as err:
            if not retried(err) or attempt + 1 == RETRY_ATTEMPTS:
                raise decode(err, service, address, secure=secure) from err
        await sleep(RETRY_BACKOFF_S[attempt])
    raise AssertionError("the last attempt returns or raises")


@contextmanager
def translated(service: str, address: str, *, secure: bool | None = None) -> Iterator[None]:
    """Inside it, a gRPC error (a stream's, say) is raised as `Unreachable` or `Refused`;
    nothing is retried."""
    try:
        yield
    except grpc.RpcError as err:
        raise decode(err, service, address, secure=secure) from err


@asynccontextmanager
async def translated_async(
    service: str, address: str, *, secure: bool | None = None
) -> AsyncIterator[None]:
    """`translated` for code that awaits grpc.aio calls and streams."""
    try:
        yield
    except grpc.RpcError as err:
        raise decode(err, service, address, secure=secure) from err
