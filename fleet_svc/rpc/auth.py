"""The fleet's one check of every call: who is calling and whether the RPC's role allows it
(llmgw.authz, shared with the planner; the fleet's table is fleet_svc.domain.access), its fair
share (fleet_svc.rpc.fairness), and the audit event of every mutation and read. A server
interceptor, so no servicer method can be reached around it.

`current_caller()` (llmgw.authz.guard) is how the servicers read who asks (for `by`,
`updated_by`, `created_by`) and which node an agent's certificate names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import structlog
from grpc_status import rpc_status

from fleet_svc.domain import errors
from fleet_svc.domain.access import (
    ANONYMOUS,
    MUTATIONS,
    Caller,
    Policy,
    Role,
    decide,
    is_public,
    short,
)
from fleet_svc.rpc.fairness import STREAMS, UNARY, Shares, busy_status
from fleet_svc.rpc.reads import ReadAudit
from fleet_svc.rpc.settings import read_roles
from fleet_svc.rpc.status import to_status
from llmgw.authz.files import RELOAD_CHECK_S, RolesFile, TokensFile, parse_tokens
from llmgw.authz.guard import (
    CALLER_KEY,
    RECHECK_S,
    Authenticator,
    Context,
    Guard,
    current_caller,
)
from llmgw.limits import DEFAULT_LIMITS, Limits
from llmgw.rpc.handlers import admitted
from llmgw.tls import ServerTLS

__all__ = [
    "CALLER_KEY",
    "RECHECK_S",
    "RELOAD_CHECK_S",
    "AuthInterceptor",
    "Authenticator",
    "authenticator_for",
    "current_caller",
    "parse_tokens",
]

log = structlog.get_logger(__name__)


def authenticator_for(
    tls: ServerTLS | None,
    tokens_path: str | Path,
    settings_path: str | Path,
    clock: Callable[[], float] = time.monotonic,
) -> Authenticator:
    """The fleet's authenticator: auth is on with a client CA (mutual TLS) or a tokens file;
    agents need node certificates whenever auth is on or TLS is served at all. Says at start
    which it is.

    Raises:
        InvalidModel: the settings' `roles:` is malformed.
        ValueError: the tokens file cannot be read or parsed.
    """
    tokens = TokensFile(Path(tokens_path)) if tokens_path else None
    auth = bool((tls is not None and tls.mutual) or tokens is not None)
    policy = Policy(
        auth=auth,
        node_certificates=auth or tls is not None,
        roles=read_roles(settings_path or None),
    )
    roles = RolesFile(Path(settings_path), policy, clock, read_roles) if settings_path else None
    if auth:
        log.info(
            "auth_enabled",
            client_certificates=bool(tls and tls.mutual),
            tokens=str(tokens_path) if tokens else "",
            roles=policy.roles.summary(),
        )
    else:
        log.warning(
            "auth_disabled",
            note="no client CA (--tls-ca) and no --tokens: every caller may call every RPC "
            "(dev mode)"
            + ("; agents still need node certificates over TLS" if tls is not None else ""),
        )
    return Authenticator(policy, decide, tokens, roles)


# -- the interceptor -------------------------------------------------------------------------


def _model_of(message: Any) -> str:
    """The model a request or answer is about, as far as it says."""
    for path in (("name",), ("model", "name"), ("model", "model", "name"), ("rollout", "model")):
        value: Any = message
        for part in path:
            value = getattr(value, part, None)
            if value is None:
                break
        if isinstance(value, str) and value:
            return value
    return ""


def _code_name(context: Context) -> str:
    code = context.code()
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return code.name
    return str(code)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against the policy before its servicer runs; audits mutations (each
    one) and reads (llmgw's ReadAudit: bounded); ends open streams whose caller is no longer
    allowed (llmgw.authz.guard.Guard)."""

    def __init__(
        self,
        auth: Authenticator,
        recheck_s: float = RECHECK_S,
        limits: Limits = DEFAULT_LIMITS,
        reads: ReadAudit | None = None,
    ) -> None:
        self.auth = auth
        self.guard = Guard(auth, to_status, recheck_s)
        self.shares = Shares(limits)
        self.reads = reads if reads is not None else ReadAudit()

    async def _take(self, kind: str, caller: Caller, context: Context) -> Callable[[], None]:
        """One of the caller's share of `kind` (fleet_svc.rpc.fairness); a caller past it is
        refused RESOURCE_EXHAUSTED with RetryInfo. Without auth (dev mode: nobody verified)
        only the totals hold, since every caller is the same nobody."""
        policy = self.auth.policy
        own_share = caller.kind == "node" or (
            caller.kind != ANONYMOUS and policy.roles.role_of(caller.name) is Role.ADMIN
        )
        who = caller.identity if policy.auth else ""
        try:
            return self.shares.acquire(kind, who, own_share=own_share)
        except errors.TooManyCalls as exc:
            log.warning("call_refused_busy", identity=caller.identity, limit=exc.limit)
            await context.abort_with_status(rpc_status.to_status(busy_status(exc)))
            raise AssertionError("abort_with_status returns only by raising") from exc

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or is_public(method):
            return handler
        wrapped: grpc.RpcMethodHandler[Any, Any] = self._wrapped(handler, method)
        return wrapped

    async def _admit(self, method: str, request: Any, context: Context) -> Caller:
        """The caller, allowed; a refusal aborts the call (and is audited)."""

        def refused(caller: Caller | None, why: str) -> None:
            if method in MUTATIONS:
                self._audit(method, caller, request, None, "refused", why)
            else:
                self.reads.record(method, caller, _model_of(request), "refused", why)

        return await self.guard.admit(method, context, refused)

    def _audit(
        self,
        method: str,
        caller: Caller | None,
        request: Any,
        answer: Any,
        outcome: str,
        reason: str = "",
    ) -> None:
        """One structured event per mutation: who, what, which model, how it ended."""
        model = _model_of(request) if request is not None else ""
        if not model and answer is not None:
            model = _model_of(answer)
        log.info(
            "audit",
            identity=caller.identity if caller else "unverified",
            by=caller.audit_name if caller else "",
            via=caller.how if caller else "none",
            rpc=short(method),
            model=model,
            rollout=getattr(request, "id", "") if request is not None else "",
            dry_run=bool(getattr(request, "dry_run", False)),
            outcome=outcome,
            reason=reason[:300],
        )

    def _wrapped(self, handler: Any, method: str) -> Any:
        guard = self.guard
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Context) -> Any:
                caller = await self._admit(method, request, context)
                release = await self._take(UNARY, caller, context)
                try:
                    if method not in MUTATIONS:
                        try:
                            return await inner_uu(request, context)
                        finally:
                            self.reads.record(
                                method, caller, _model_of(request), _code_name(context)
                            )
                    try:
                        answer = await inner_uu(request, context)
                    except BaseException:
                        self._audit(method, caller, request, None, _code_name(context))
                        raise
                    self._audit(method, caller, request, answer, _code_name(context))
                    return answer
                finally:
                    release()

            return handler._replace(unary_unary=unary_unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                caller = await self._admit(method, request, context)
                release = await self._take(STREAMS, caller, context)
                self.reads.record(method, caller, _model_of(request), "opened")
                call = guard.track(method, caller)
                try:
                    async for message in inner_us(request, context):
                        yield message
                except asyncio.CancelledError:
                    await guard.cut(call, method, context)
                finally:
                    release()
                    guard.untrack(call)

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
                caller = await self._admit(method, None, context)
                call = guard.track(method, caller)
                try:
                    async for message in inner_ss(requests, context):
                        yield message
                except asyncio.CancelledError:
                    await guard.cut(call, method, context)
                finally:
                    guard.untrack(call)

            return handler._replace(stream_stream=stream_stream)
        return admitted(handler, lambda request, context: self._admit(method, request, context))
