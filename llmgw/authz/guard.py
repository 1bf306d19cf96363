"""The call guard every llmgw server puts in front of its servicers: who is calling (client
certificate, bearer token, a gateway's person), whether the service's rules allow the call,
and the calls still running whose caller has since lost the right, ended within seconds.

The caller it establishes is kept in a context variable for the call's task: `current_caller()`
is how servicers read who asks."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
import structlog
from google.rpc import status_pb2
from grpc_status import rpc_status

from llmgw.authz.files import RolesFile, TokensFile
from llmgw.authz.policy import (
    ANONYMOUS,
    AccessRefusal,
    Caller,
    Policy,
    Unauthenticated,
    short,
    token_hash,
)
from llmgw.identity import IdentityError, check_name, peer_certificate_ids, peer_identity

log = structlog.get_logger(__name__)

CALLER_KEY = "x-llmgw-caller"
"""Metadata naming the person behind a call: recorded as such only from a gateway (and, in dev
mode, where nothing is verified, as the claim of an unverified caller)."""
AUTHORIZATION = "authorization"

Context = Any  # grpc.aio.ServicerContext[Any, Any]
Decide = Callable[[str, Caller, Policy], None]
"""A service's rule: allow `method` to `caller` under the policy, or raise an AccessRefusal."""

_CURRENT: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "llmgw_caller", default=None
)


def current_caller() -> Caller | None:
    """The caller of the RPC running in this task (None outside one)."""
    return _CURRENT.get()


def _metadata(context: Context, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and v:
            return str(v)
    return ""


class Authenticator:
    """Who a call is from, under a policy: the client certificate's identity when there is
    one, else a bearer token's user; a gateway's `x-llmgw-caller` as the person it acts for.
    `decide` is the service's rule."""

    def __init__(
        self,
        policy: Policy,
        decide: Decide,
        tokens: TokensFile | None = None,
        roles: RolesFile | None = None,
    ) -> None:
        self._policy = policy
        self.decide = decide
        self.tokens = tokens
        self.roles = roles

    @property
    def policy(self) -> Policy:
        """The policy in force (the roles file re-read when it changed)."""
        return self.roles.current() if self.roles is not None else self._policy

    @property
    def live(self) -> bool:
        """Whether anything the policy rests on can change while the server runs."""
        return self.tokens is not None or self.roles is not None

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
            self.decide(method, caller, self.policy)
        except AccessRefusal as exc:
            return exc.message
        return ""

    def caller(self, context: Context) -> Caller:
        """The call's caller.

        Raises:
            Unauthenticated: a bearer token was given and is wrong (never ignored: a caller
                who sent one meant to be someone), or a gateway named no valid person.
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
                raise Unauthenticated(f"{CALLER_KEY}: {exc}", rpc="") from exc
        return caller

    def _by_token(self, context: Context, peer: str) -> Caller:
        header = _metadata(context, AUTHORIZATION)
        if not header:
            return Caller(ANONYMOUS, peer=peer)
        scheme, _, token = header.partition(" ")
        service = self._policy.service
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization metadata is `Bearer TOKEN`", rpc="")
        if self.tokens is None:
            raise Unauthenticated(
                f"this {service} takes no bearer tokens (it was started without --tokens)", rpc=""
            )
        user = self.tokens.current().who(token.strip())
        if user is None and self.tokens.failure:
            raise Unauthenticated(
                f"no bearer token is accepted until the tokens file parses again: "
                f"{self.tokens.failure}",
                rpc="",
            )
        if user is None:
            raise Unauthenticated(f"the bearer token is not one the {service} knows", rpc="")
        return Caller("user", user, "token", peer=peer, token_sha256=token_hash(token.strip()))


RECHECK_S = 1.0
"""How often running calls' callers are checked again: a revoked identity's or token's
stream (or long call) ends within about this (plus RELOAD_CHECK_S for a roles file)."""


@dataclass(eq=False)
class OpenCall:
    """A call admitted for `caller`, run by `task`; `ended` says why it was cut."""

    method: str
    caller: Caller
    task: asyncio.Task[Any] | None
    ended: str = ""


ToStatus = Callable[[AccessRefusal], status_pb2.Status]


class Guard:
    """Admits calls (aborting a refusal with the service's status), and while calls it
    tracks are open checks their callers again every `recheck_s`, cancelling those no longer
    allowed; `cut` then ends such a call UNAUTHENTICATED, saying why."""

    def __init__(self, auth: Authenticator, to_status: ToStatus, recheck_s: float = RECHECK_S):
        self.auth = auth
        self.to_status = to_status
        self.recheck_s = recheck_s
        self._open: dict[int, OpenCall] = {}
        self._watcher: asyncio.Task[None] | None = None

    async def admit(
        self,
        method: str,
        context: Context,
        on_refused: Callable[[Caller | None, str], None] | None = None,
    ) -> Caller:
        """The caller, allowed and set as `current_caller()`; a refusal is logged, passed to
        `on_refused(caller, why)` (the fleet audits refused mutations) and aborts the call."""
        caller: Caller | None = None
        try:
            caller = self.auth.caller(context)
            self.auth.decide(method, caller, self.auth.policy)
        except AccessRefusal as exc:
            if isinstance(exc, Unauthenticated) and not exc.rpc:
                exc.rpc = short(method)
            log.warning(
                "call_refused",
                rpc=short(method),
                identity=caller.identity if caller else "unverified",
                peer=context.peer(),
                code=grpc.StatusCode.UNAUTHENTICATED.name
                if isinstance(exc, Unauthenticated)
                else grpc.StatusCode.PERMISSION_DENIED.name,
                reason=exc.message,
            )
            if on_refused is not None:
                on_refused(caller, exc.message)
            await context.abort_with_status(rpc_status.to_status(self.to_status(exc)))
            raise AssertionError("abort_with_status returns only by raising") from exc
        _CURRENT.set(caller)
        return caller

    def track(self, method: str, caller: Caller) -> OpenCall | None:
        """Record a running call to check again; None when nothing the policy rests on can
        change while the server runs (no tokens file, no settings file)."""
        if not self.auth.live:
            return None
        call = OpenCall(method, caller, asyncio.current_task())
        self._open[id(call)] = call
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._recheck())
        return call

    def untrack(self, call: OpenCall | None) -> None:
        """Forget a call that ended."""
        if call is not None:
            self._open.pop(id(call), None)

    @property
    def open_calls(self) -> int:
        """How many calls are tracked now."""
        return len(self._open)

    async def _recheck(self) -> None:
        """While calls are open: every `recheck_s`, cut those whose caller lost the right."""
        while self._open:
            await asyncio.sleep(self.recheck_s)
            for call in list(self._open.values()):
                if call.ended or call.task is None:
                    continue
                why = self.auth.still_allowed(call.method, call.caller)
                if why:
                    call.ended = why
                    log.warning(
                        "call_cut",
                        rpc=short(call.method),
                        identity=call.caller.identity,
                        by=call.caller.audit_name,
                        reason=why,
                    )
                    call.task.cancel()

    async def cut(self, call: OpenCall | None, method: str, context: Context) -> None:
        """End a cut call with UNAUTHENTICATED and the reason; re-raise a cancellation that
        was not ours."""
        if call is None or not call.ended:
            raise asyncio.CancelledError
        status = self.to_status(Unauthenticated(call.ended, rpc=short(method)))
        await context.abort_with_status(rpc_status.to_status(status))
