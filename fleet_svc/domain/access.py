"""Who may call what on the fleet (pure: no grpc, no I/O).

Roles, each including the ones before it:

- viewer: every read and watch (catalog, nodes, replicas, rollouts);
- operator: + SetContext, SetGPUs, CancelRollout, UndoRollout, PromoteRollout;
- admin: + CreateModel, UpdateModel, DeleteModel.

`agent` is apart: AgentService.Connect, for node identities only (spiffe://llmgw/node/NAME),
which have no other role. `gateway` is apart too: ReportTraffic, for the identities the
settings list under `gateway:` only (whatever other role they have; in dev mode, anyone).
Health and reflection need nobody.

The roles, callers, revoked list and tokens are the planner's too (llmgw.authz.policy);
this module holds the fleet's own table and decision.

One table, `RPC_ROLES`, names the role of every RPC; `decide` applies it. An RPC missing from
the table is refused to everyone (a new RPC is closed until someone puts it in the table; a
unit test holds the table to the services' descriptors).

Acting for others (the gateway): an identity the settings list under `gateway` may name the
person it acts for in `x-llmgw-caller`. The call is then allowed only as far as both the
gateway's role and that person's allow (a gateway cannot lift a viewer to admin, and a person
cannot borrow the gateway's role), and recorded as `gateway for alice`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet_svc.domain import errors
from llmgw.authz import policy as shared
from llmgw.authz.policy import (
    ANONYMOUS,
    DEFAULT_ROLES,
    EVERYONE,
    NODE,
    PUBLIC_PREFIXES,
    USER,
    Caller,
    InvalidRoles,
    Policy,
    Role,
    Roles,
    Tokens,
    is_public,
    refuse_unreadable_or_revoked,
    require_role,
    role_text,
    short,
    token_hash,
)

__all__ = [
    "AGENT",
    "AGENT_ROLE",
    "ANONYMOUS",
    "DEFAULT_ROLES",
    "EVERYONE",
    "FLEET",
    "MUTATIONS",
    "NODE",
    "PUBLIC_PREFIXES",
    "RPC_ROLES",
    "USER",
    "Caller",
    "Policy",
    "Role",
    "Roles",
    "Tokens",
    "decide",
    "is_public",
    "parse_roles",
    "short",
    "token_hash",
]

FLEET = "/llmgw.fleet.v1.FleetService/"
AGENT = "/llmgw.agent.v1.AgentService/"

AGENT_ROLE = "agent"
"""Connect's requirement: a node identity (not a role a user can be given)."""

GATEWAY_ROLE = "gateway"
"""ReportTraffic's requirement: an identity listed under the settings' `gateway:`."""

Need = Role | str

RPC_ROLES: Mapping[str, Need] = {
    FLEET + "GetModel": Role.VIEWER,
    FLEET + "ListModels": Role.VIEWER,
    FLEET + "ListModelRevisions": Role.VIEWER,
    FLEET + "ListNodes": Role.VIEWER,
    FLEET + "ListReplicas": Role.VIEWER,
    FLEET + "WatchReplicas": Role.VIEWER,
    FLEET + "GetRollout": Role.VIEWER,
    FLEET + "ListRollouts": Role.VIEWER,
    FLEET + "WatchRollout": Role.VIEWER,
    FLEET + "SetContext": Role.OPERATOR,
    FLEET + "SetGPUs": Role.OPERATOR,
    FLEET + "CancelRollout": Role.OPERATOR,
    FLEET + "UndoRollout": Role.OPERATOR,
    FLEET + "PromoteRollout": Role.OPERATOR,
    FLEET + "ReportTraffic": GATEWAY_ROLE,
    FLEET + "CreateModel": Role.ADMIN,
    FLEET + "UpdateModel": Role.ADMIN,
    FLEET + "DeleteModel": Role.ADMIN,
    AGENT + "Connect": AGENT_ROLE,
}
"""The role every RPC needs. WatchRollout is a read (the events GetRollout shows, live)."""

MUTATIONS = frozenset(
    FLEET + m
    for m in (
        "CreateModel",
        "UpdateModel",
        "DeleteModel",
        "SetContext",
        "SetGPUs",
        "CancelRollout",
        "UndoRollout",
        "PromoteRollout",
    )
)
"""The RPCs that change the fleet: each one, allowed or refused, is one audit event."""


def parse_roles(data: object, source: str = "settings") -> Roles:
    """The settings' `roles:` section (llmgw.authz.policy.parse_roles), refused as the fleet
    refuses a bad settings file.

    Raises:
        InvalidModel: not a mapping of role names, `gateway` and `revoked` to lists.
    """
    try:
        return shared.parse_roles(data, source)
    except InvalidRoles as exc:
        raise errors.InvalidModel(exc.message, field=exc.field) from exc


def _gateway_only(rpc: str, caller: Caller, policy: Policy) -> None:
    """Allow a gateway identity acting for nobody; refuse everyone else.

    Raises:
        Unauthenticated, RoleRequired.
    """
    if caller.kind == ANONYMOUS:
        raise errors.Unauthenticated(
            f"{rpc} needs a gateway's client certificate or token", rpc=rpc
        )
    gateway = caller.kind == USER and policy.roles.may_act_for_others(caller.name)
    if gateway and not caller.acting_for:
        return
    role = policy.roles.role_of(caller.name) if caller.kind == USER else None
    raise errors.RoleRequired(
        f"{rpc} is for gateways (the settings' `gateway:` list), reporting for themselves:"
        f" {caller.identity} is not one" + (" (or names a person)" if caller.acting_for else ""),
        rpc=rpc,
        identity=caller.identity,
        required=GATEWAY_ROLE,
        has=AGENT_ROLE if caller.kind == NODE else role_text(role),
    )


def decide(method: str, caller: Caller, policy: Policy) -> None:
    """Allow a call or raise the refusal.

    Raises:
        Unauthenticated: auth is on and the caller is nobody (or revoked).
        RoleRequired: the caller's roles do not reach the RPC's.
    """
    if is_public(method):
        return
    rpc = short(method)
    need = RPC_ROLES.get(method)
    refuse_unreadable_or_revoked(rpc, caller, policy)
    if need == GATEWAY_ROLE:
        if policy.auth:
            _gateway_only(rpc, caller, policy)
        return
    if need != AGENT_ROLE:
        require_role(rpc, need if isinstance(need, Role) else None, caller, policy)
        return
    if caller.kind == NODE or (not policy.node_certificates and caller.kind == ANONYMOUS):
        return
    if caller.kind == ANONYMOUS:
        raise errors.Unauthenticated(
            f"{rpc} needs a node certificate (spiffe://llmgw/node/NAME) signed by the "
            "fleet's client CA",
            rpc=rpc,
        )
    raise errors.RoleRequired(
        f"{rpc} is for node agents: {caller.identity} is not a node identity",
        rpc=rpc,
        identity=caller.identity,
        required=AGENT_ROLE,
        has=role_text(policy.roles.role_of(caller.name)),
    )
