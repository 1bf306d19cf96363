"""The fleet's one check of every call: who is calling (client certificate, bearer token),
whether the RPC's role allows it (fleet_svc.domain.access), and the audit event of every
mutation. A server interceptor, so no servicer method can be reached around it.

The caller it establishes is kept in a context variable for the call's task:
`current_caller()` is how the servicers read who asks (for `by`, `updated_by`, `created_by`)
and which node an agent's certificate names.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Awaitable, Callable
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
    Tokens,
    decide,
    is_public,
    short,
)
from fleet_svc.rpc.settings import read_roles
from fleet_svc.rpc.status import to_status
from llmgw.rpc.handlers import admitted
from llmgw.tls import IdentityError, ServerTLS, check_name, peer_identity

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
        ValueError: a line or entry that is neither, a bad name or a bad hash.
    """
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    pairs: list[tuple[str, str]] = []
    if all(_LINE.fullmatch(ln) for ln in lines):
        for ln in lines:
            m = _LINE.fullmatch(ln)
            assert m is not None
            pairs.append((m.group(1), m.group(2)))
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{where}: neither `NAME SHA256HEX` lines nor YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{where}: lines `NAME SHA256HEX` or a YAML map NAME: SHA256HEX")
        pairs = [(str(k), str(v)) for k, v in data.items()]
    for name, _ in pairs:
        try:
            check_name(name)
        except IdentityError as exc:
            raise ValueError(f"{where}: {exc}") from exc
    try:
        return Tokens.of(pairs)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


class TokensFile:
    """A tokens file, read again when it changes (size or mtime), so revoking a token is
    deleting its line. A file that stops parsing keeps the last good table (and says so)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
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
        """The table, re-read if the file changed."""
        try:
            st = self.path.stat()
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self.tokens = self._load()
                log.info("tokens_reloaded", path=str(self.path), users=len(self.tokens.hashes))
        except (OSError, ValueError) as exc:
            log.warning("tokens_reload_failed", path=str(self.path), error=str(exc))
        return self.tokens


# -- who is calling --------------------------------------------------------------------------


def _metadata(context: Context, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key and v:
            return str(v)
    return ""


class Authenticator:
    """Who a call is from, under a policy: the client certificate's identity when there is
    one, else a bearer token's user; a gateway's `x-llmgw-caller` as the person it acts for."""

    def __init__(self, policy: Policy, tokens: TokensFile | None = None) -> None:
        self.policy = policy
        self.tokens = tokens

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
            caller = Caller(identity.kind, identity.name, "certificate", peer=peer)
        else:
            caller = self._by_token(context, peer)
        if caller.kind == ANONYMOUS:
            # Nothing verified: the claim is recorded as the caller's own (dev mode), never
            # trusted for a decision.
            return Caller(ANONYMOUS, claimed=claimed[:200], peer=peer)
        if claimed and claimed != caller.name and self.policy.roles.may_act_for_others(caller.name):
            try:
                return Caller(
                    caller.kind, caller.name, caller.how, acting_for=check_name(claimed), peer=peer
                )
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
        if user is None:
            raise errors.Unauthenticated("the bearer token is not one the fleet knows", rpc="")
        return Caller("user", user, "token", peer=peer)


def authenticator_for(
    tls: ServerTLS | None, tokens_path: str | Path, settings_path: str | Path
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
    return Authenticator(policy, tokens)


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
    """Checks every call against the policy before its servicer runs; audits mutations."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

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
                if method not in MUTATIONS:
                    return await inner_uu(request, context)
                try:
                    answer = await inner_uu(request, context)
                except BaseException:
                    self._audit(method, caller, request, None, _code_name(context))
                    raise
                self._audit(method, caller, request, answer, _code_name(context))
                return answer

            return handler._replace(unary_unary=unary_unary)
        return admitted(handler, lambda request, context: self._admit(method, request, context))
