"""Who may call the planner: the fleet's rules (llmgw.authz: the same roles, revoked list,
tokens and live re-reading) over the planner's own table. Every planner RPC is a read that
may fetch on the caller's account, so each needs the viewer role; the fleet's client identity
(`user:fleet`) is a viewer of the planner unless the roles say otherwise or revoke it. Calls
of a caller revoked while they run (a resolution may fetch for up to a minute) are ended
UNAUTHENTICATED within about two seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import structlog

from llmgw.authz.files import RolesFile, TokensFile, read_settings_roles
from llmgw.authz.guard import RECHECK_S, Authenticator, Context, Guard
from llmgw.authz.policy import (
    DEFAULT_ROLES,
    NODE,
    Caller,
    Policy,
    Role,
    RoleRequired,
    Roles,
    is_public,
    refuse_unreadable_or_revoked,
    require_role,
    short,
)
from llmgw.rpc.handlers import admitted
from llmgw.tls import ServerTLS
from planner_svc.rpc.status import to_status

log = structlog.get_logger(__name__)

PLANNER = "/llmgw.planner.v1.PlannerService/"

RPC_ROLES: Mapping[str, Role] = {
    PLANNER + "SizeContext": Role.VIEWER,
    PLANNER + "PlanGPUs": Role.VIEWER,
    PLANNER + "DescribeModel": Role.VIEWER,
}
"""The role every planner RPC needs (an RPC not listed is refused to everyone)."""

FLEET_USER = "fleet"
"""The identity of the fleet's client pair towards the planner (`fleet-client.crt`)."""


def with_fleet(roles: Roles) -> Roles:
    """`roles` with the fleet's client a viewer when they give it no role of its own (a
    `revoked: [user:fleet]` entry still shuts it out)."""
    if FLEET_USER in roles.members:
        return roles
    return replace(roles, members={**roles.members, FLEET_USER: Role.VIEWER})


def read_planner_roles(path: Path) -> Roles:
    """The roles the cluster settings at `path` give the planner.

    Raises:
        InvalidRoles: the file cannot be read or its `roles:` is malformed.
    """
    return with_fleet(read_settings_roles(path))


def decide(method: str, caller: Caller, policy: Policy) -> None:
    """Allow a planner call or raise the refusal.

    Raises:
        Unauthenticated: auth is on and the caller is nobody, or revoked, or the roles are
            unreadable.
        RoleRequired: the caller's roles do not reach the RPC's (a node never does).
    """
    if is_public(method):
        return
    rpc = short(method)
    refuse_unreadable_or_revoked(rpc, caller, policy)
    need = RPC_ROLES.get(method)
    if policy.auth and caller.kind == NODE and need is not None:
        raise RoleRequired(
            f"{rpc} needs the {need.label} role: a node's certificate is for the fleet only",
            rpc=rpc,
            identity=caller.identity,
            required=need.label,
            has="agent",
        )
    require_role(rpc, need, caller, policy)


def authenticator_for(
    tls: ServerTLS | None,
    tokens_path: str | Path = "",
    settings_path: str | Path = "",
    clock: Callable[[], float] = time.monotonic,
) -> Authenticator:
    """The planner's authenticator: auth is on with a client CA (mutual TLS) or a tokens
    file; roles from the settings' `roles:` (re-read when the file changes), else the
    defaults (admin, viewer) with the fleet a viewer. Says at start which it is.

    Raises:
        InvalidRoles: the settings' `roles:` is malformed.
        ValueError: the tokens file cannot be read or parsed.
    """
    tokens = TokensFile(Path(tokens_path)) if tokens_path else None
    auth = bool((tls is not None and tls.mutual) or tokens is not None)
    roles = read_planner_roles(Path(settings_path)) if settings_path else with_fleet(DEFAULT_ROLES)
    policy = Policy(auth=auth, roles=roles, service="planner")
    live = (
        RolesFile(Path(settings_path), policy, clock, read_planner_roles) if settings_path else None
    )
    if auth:
        log.info(
            "auth_enabled",
            client_certificates=bool(tls and tls.mutual),
            tokens=str(tokens_path) if tokens else "",
            roles=roles.summary(),
        )
    else:
        log.warning(
            "auth_disabled",
            note="no client CA (--tls-ca) and no --tokens: every caller may call every RPC "
            "(dev mode); revoked identities stay out",
        )
    return Authenticator(policy, decide, tokens, live)


class PlannerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every planner call before its servicer runs, and ends a running call whose
    caller is revoked or loses its role meanwhile (llmgw.authz.guard.Guard)."""

    def __init__(self, auth: Authenticator, recheck_s: float = RECHECK_S) -> None:
        self.auth = auth
        self.guard = Guard(auth, to_status, recheck_s)

    def _admits_everyone(self) -> bool:
        """Dev mode with nothing that could refuse (no auth, no revoked entry, no file that
        could add one): the check is skipped, not run to the same answer on the hot path."""
        policy = self.auth.policy
        return not (policy.auth or policy.roles.revoked or policy.failure or self.auth.live)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or is_public(method) or self._admits_everyone():
            return handler
        if handler.unary_unary is None:
            wrapped: grpc.RpcMethodHandler[Any, Any] = admitted(
                handler, lambda request, context: self.guard.admit(method, context)
            )
            return wrapped
        inner = handler.unary_unary
        guard = self.guard

        async def unary_unary(request: Any, context: Context) -> Any:
            caller = await guard.admit(method, context)
            call = guard.track(method, caller)
            try:
                return await inner(request, context)
            except asyncio.CancelledError:
                await guard.cut(call, method, context)
                raise
            finally:
                guard.untrack(call)

        plain: Any = handler
        out: grpc.RpcMethodHandler[Any, Any] = plain._replace(unary_unary=unary_unary)
        return out
