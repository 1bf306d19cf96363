"""The fleet's one check of every call: who is calling (client certificate, bearer token),
whether the RPC's role allows it (fleet_svc.domain.access), and the audit event of every
mutation. A server interceptor, so no servicer method can be reached around it.

The caller it establishes is kept in a context variable for the call's task:
`current_caller()` is how the servicers read who asks (for `by`, `updated_by`, `created_by`)
and which node an agent's certificate names.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import structlog
import yaml
from grpc_status import rpc_status

from fleet_svc.domain import errors
from fleet_svc.domain.access import (
    ANONYMOUS,
    MUTATIONS,
    Caller,
    Policy,
    Role,
    Tokens,
    decide,
    is_public,
    short,
    token_hash,
)
from fleet_svc.rpc.fairness import STREAMS, UNARY, Shares, busy_status
from fleet_svc.rpc.settings import read_roles
from fleet_svc.rpc.status import to_status
from llmgw.limits import DEFAULT_LIMITS, Limits
from llmgw.rpc.handlers import admitted
from llmgw.tls import IdentityError, ServerTLS, check_name, peer_certificate_ids, peer_identity

log = structlog.get_logger(__name__)

CALLER_KEY = "x-llmgw-caller"
"""Metadata naming the person behind a call: recorded as such only from a gateway (and, in dev
mode, where nothing is verified, as before)."""
AUTHORIZATION = "authorization"

_CURRENT: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "llmgw_fleet_caller", default=None
)

Context = Any  # grpc.aio.ServicerContext[Any, Any]


def current_caller() -> Caller | None:
    """The caller of the RPC running in this task (None outside one)."""
    return _CURRENT.get()


# -- the tokens file -------------------------------------------------------------------------

_LINE = re.compile(r"^([^\s:]+)\s+([0-9A-Fa-f]{64})$")


def parse_tokens(text: str, where: str = "tokens") -> Tokens:
    """A tokens file: lines `NAME SHA256HEX` (`#` comments and blank lines skipped), or a YAML
    mapping `NAME: SHA256HEX`. Each NAME is a user (`spiffe://llmgw/user/NAME` by token).

    Raises:
        ValueError: a line or entry that is neither, a bad name or a bad hash; the message
            names the line.
    """
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)]
    numbered = [(i, ln) for i, ln in numbered if ln and not ln.startswith("#")]
    pairs: list[tuple[int, str, str]] = []
    bad = [(i, ln) for i, ln in numbered if not _LINE.fullmatch(ln)]
    if not bad:
        for i, ln in numbered:
            m = _LINE.fullmatch(ln)
            assert m is not None
            pairs.append((i, m.group(1), m.group(2)))
    else:
        data: object = None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        if not isinstance(data, dict):
            line, _ = bad[0]
            raise ValueError(
                f"{where}, line {line}: not `NAME SHA256HEX` (and the file is no YAML map "
                "NAME: SHA256HEX)"
            )
        lines = {ln.split(":", 1)[0].strip(): i for i, ln in numbered}
        pairs = [(lines.get(str(k), 0), str(k), str(v)) for k, v in data.items()]
    for line, name, digest in pairs:
        try:
            check_name(name)
            Tokens.of([(name, digest)])
        except (IdentityError, ValueError) as exc:
            raise ValueError(f"{where}, line {line}: {exc}") from exc
    return Tokens.of([(name, digest) for _, name, digest in pairs])


class TokensFile:
    """A tokens file, read again when it changes (size or mtime), so revoking a token is
    deleting its line. A file that stops parsing fails closed: no token is accepted until it
    parses again, and the refusal names the line at fault."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.failure = ""
        self.tokens = self._load()

    def _load(self) -> Tokens:
        try:
            st = self.path.stat()
            text = self.path.read_text()
        except OSError as exc:
            raise ValueError(f"the tokens file {self.path} cannot be read: {exc.strerror}") from exc
        self._stamp = (st.st_mtime_ns, st.st_size)
        return parse_tokens(text, str(self.path))

    def current(self) -> Tokens:
        """The table, re-read if the file changed; empty while the file does not parse."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError as exc:
            stamp = None
            error = f"the tokens file {self.path} cannot be read: {exc.strerror}"
        if stamp is not None and stamp == self._stamp:
            return self.tokens
        try:
            if stamp is None:
                raise ValueError(error)
            self.tokens = self._load()
            self.failure = ""
            log.info("tokens_reloaded", path=str(self.path), users=len(self.tokens.hashes))
        except ValueError as exc:
            if not self.failure:
                log.error("tokens_reload_failed", path=str(self.path), error=str(exc))
            self.failure = str(exc)
            self.tokens = Tokens()
            self._stamp = stamp
        return self.tokens


class RolesFile:
    """The settings file's `roles:`, read again when the file changes (checked at most once
    every `RELOAD_CHECK_S`). A file that stops parsing fails closed: the policy carries the
    failure, and every call but health and reflection is refused until it parses again."""

    def __init__(self, path: Path, policy: Policy, clock: Callable[[], float]) -> None:
        self.path = path
        self.policy = policy
        self._clock = clock
        self._checked = clock()
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> Policy:
        """The policy, its roles re-read if the file changed."""
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return self.policy
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return self.policy
        self._stamp = stamp
        try:
            roles = read_roles(self.path)
        except errors.InvalidModel as exc:
            if not self.policy.failure:
                log.error("roles_reload_failed", path=str(self.path), error=exc.message)
            self.policy = replace(self.policy, failure=exc.message)
            return self.policy
        self.policy = replace(self.policy, roles=roles, failure="")
        log.info("roles_reloaded", path=str(self.path), roles=roles.summary())
        return self.policy


RELOAD_CHECK_S = 1.0
"""How often the roles file's stamp is looked at: a revocation takes effect within this."""


# -- who is calling --------------------------------------------------------------------------


def _metadata(context: Context, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and v:
            return str(v)
    return ""


class Authenticator:
    """Who a call is from, under a policy: the client certificate's identity when there is
    one, else a bearer token's user; a gateway's `x-llmgw-caller` as the person it acts for."""

    def __init__(
        self,
        policy: Policy,
        tokens: TokensFile | None = None,
        roles: RolesFile | None = None,
    ) -> None:
        self._policy = policy
        self.tokens = tokens
        self.roles = roles

    @property
    def policy(self) -> Policy:
        """The policy in force (the roles file re-read when it changed)."""
        return self.roles.current() if self.roles is not None else self._policy

    def still_allowed(self, method: str, caller: Caller) -> str:
        """Why a caller admitted before may no longer call `method` ("" when it still may):
        revoked since, its role taken away, its token's line deleted, a file now malformed."""
        if caller.how == "token":
            tokens = self.tokens.current() if self.tokens is not None else None
            expected = tokens.hashes.get(caller.name) if tokens is not None else None
            if expected is None or expected.hex() != caller.token_sha256:
                failure = self.tokens.failure if self.tokens is not None else ""
                return failure or f"the bearer token of user:{caller.name} was revoked"
        try:
            decide(method, caller, self.policy)
        except (errors.Unauthenticated, errors.RoleRequired) as exc:
            return exc.message
        return ""

    def caller(self, context: Context) -> Caller:
        """The call's caller.

        Raises:
            Unauthenticated: a bearer token was given and is wrong (never ignored: a caller
                who sent one meant to be someone).
        """
        peer = context.peer() or ""
        claimed = _metadata(context, CALLER_KEY)
        identity = peer_identity(context)
        if identity is not None:
            ids = peer_certificate_ids(context)
            caller = Caller(
                identity.kind,
                identity.name,
                "certificate",
                peer=peer,
                serial=ids.serial if ids else "",
                fingerprint=ids.fingerprint if ids else "",
            )
        else:
            caller = self._by_token(context, peer)
        if caller.kind == ANONYMOUS:
            # Nothing verified: the claim is recorded as the caller's own (dev mode), never
            # trusted for a decision.
            return Caller(ANONYMOUS, claimed=claimed[:200], peer=peer)
        if claimed and claimed != caller.name and self.policy.roles.may_act_for_others(caller.name):
            try:
                return replace(caller, acting_for=check_name(claimed))
            except IdentityError as exc:
                raise errors.Unauthenticated(f"{CALLER_KEY}: {exc}", rpc="") from exc
        return caller

    def _by_token(self, context: Context, peer: str) -> Caller:
        header = _metadata(context, AUTHORIZATION)
        if not header:
            return Caller(ANONYMOUS, peer=peer)
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.Unauthenticated("authorization metadata is `Bearer TOKEN`", rpc="")
        if self.tokens is None:
            raise errors.Unauthenticated(
                "this fleet takes no bearer tokens (it was started without --tokens)", rpc=""
            )
        user = self.tokens.current().who(token.strip())
        if user is None and self.tokens.failure:
            raise errors.Unauthenticated(
                f"no bearer token is accepted until the tokens file parses again: "
                f"{self.tokens.failure}",
                rpc="",
            )
        if user is None:
            raise errors.Unauthenticated("the bearer token is not one the fleet knows", rpc="")
        return Caller("user", user, "token", peer=peer, token_sha256=token_hash(token.strip()))


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
    roles = RolesFile(Path(settings_path), policy, clock) if settings_path else None
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
    return Authenticator(policy, tokens, roles)


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


RECHECK_S = 1.0
"""How often open streams' callers are checked again: a revoked identity's or token's
WatchReplicas, WatchRollout or Connect ends within about this (plus RELOAD_CHECK_S for a
roles file)."""


@dataclass(eq=False)
class _OpenStream:
    """A streaming call admitted for `caller`, run by `task`; `ended` says why it was cut."""

    method: str
    caller: Caller
    task: asyncio.Task[Any] | None
    ended: str = ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against the policy before its servicer runs; audits mutations;
    checks open streams' callers again every `recheck_s` and ends those no longer allowed
    (UNAUTHENTICATED, saying why)."""

    def __init__(
        self, auth: Authenticator, recheck_s: float = RECHECK_S, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.auth = auth
        self.recheck_s = recheck_s
        self.shares = Shares(limits)
        self._streams: dict[int, _OpenStream] = {}
        self._watcher: asyncio.Task[None] | None = None

    def _track(self, method: str, caller: Caller) -> _OpenStream | None:
        """Record a stream to check again; None when nothing the policy rests on can change
        while the fleet runs (no tokens file, no settings file)."""
        if self.auth.tokens is None and self.auth.roles is None:
            return None
        stream = _OpenStream(method, caller, asyncio.current_task())
        self._streams[id(stream)] = stream
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._recheck())
        return stream

    def _untrack(self, stream: _OpenStream | None) -> None:
        if stream is not None:
            self._streams.pop(id(stream), None)

    async def _recheck(self) -> None:
        """While streams are open: every `recheck_s`, cut those whose caller lost the right."""
        while self._streams:
            await asyncio.sleep(self.recheck_s)
            for stream in list(self._streams.values()):
                if stream.ended or stream.task is None:
                    continue
                why = self.auth.still_allowed(stream.method, stream.caller)
                if why:
                    stream.ended = why
                    log.warning(
                        "stream_cut",
                        rpc=short(stream.method),
                        identity=stream.caller.identity,
                        by=stream.caller.audit_name,
                        reason=why,
                    )
                    stream.task.cancel()

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

    async def _cut(self, stream: _OpenStream | None, method: str, context: Context) -> None:
        """End a cut stream with UNAUTHENTICATED and the reason; re-raise a cancel that was
        not ours."""
        if stream is None or not stream.ended:
            raise asyncio.CancelledError
        status = to_status(errors.Unauthenticated(stream.ended, rpc=short(method)))
        await context.abort_with_status(rpc_status.to_status(status))

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
        """The caller, allowed; a refusal aborts the call (and is audited for mutations)."""
        caller: Caller | None = None
        try:
            caller = self.auth.caller(context)
            decide(method, caller, self.auth.policy)
        except (errors.Unauthenticated, errors.RoleRequired) as exc:
            if not exc.rpc:
                exc.rpc = short(method)
            status = to_status(exc)
            log.warning(
                "call_refused",
                rpc=short(method),
                identity=caller.identity if caller else "unverified",
                peer=context.peer(),
                code=grpc.StatusCode.UNAUTHENTICATED.name
                if isinstance(exc, errors.Unauthenticated)
                else grpc.StatusCode.PERMISSION_DENIED.name,
                reason=exc.message,
            )
            if method in MUTATIONS:
                self._audit(method, caller, request, None, "refused", exc.message)
            await context.abort_with_status(rpc_status.to_status(status))
            raise AssertionError("abort_with_status returns only by raising") from exc
        _CURRENT.set(caller)
        return caller

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
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: Context) -> Any:
                caller = await self._admit(method, request, context)
                release = await self._take(UNARY, caller, context)
                try:
                    if method not in MUTATIONS:
                        return await inner_uu(request, context)
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
                stream = self._track(method, caller)
                try:
                    async for message in inner_us(request, context):
                        yield message
                except asyncio.CancelledError:
                    await self._cut(stream, method, context)
                finally:
                    release()
                    self._untrack(stream)

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
                caller = await self._admit(method, None, context)
                stream = self._track(method, caller)
                try:
                    async for message in inner_ss(requests, context):
                        yield message
                except asyncio.CancelledError:
                    await self._cut(stream, method, context)
                finally:
                    self._untrack(stream)

            return handler._replace(stream_stream=stream_stream)
        return admitted(handler, lambda request, context: self._admit(method, request, context))
