"""Who may call what on the fleet (pure: no grpc, no I/O).

Roles, each including the ones before it:

- viewer: every read and watch (catalog, nodes, replicas, rollouts);
- operator: + SetContext, SetGPUs, CancelRollout, UndoRollout, PromoteRollout;
- admin: + CreateModel, UpdateModel, DeleteModel.

`agent` is apart: AgentService.Connect, for node identities only (spiffe://llmgw/node/NAME),
which have no other role. `gateway` is apart too: ReportTraffic, for the identities the
settings list under `gateway:` only (whatever other role they have; in dev mode, anyone).
Health and reflection need nobody.

One table, `RPC_ROLES`, names the role of every RPC; `decide` applies it. An RPC missing from
the table is refused to everyone (a new RPC is closed until someone puts it in the table; a
unit test holds the table to the services' descriptors).

Acting for others (the gateway): an identity the settings list under `gateway` may name the
person it acts for in `x-llmgw-caller`. The call is then allowed only as far as both the
gateway's role and that person's allow (a gateway cannot lift a viewer to admin, and a person
cannot borrow the gateway's role), and recorded as `gateway for alice`.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet_svc.domain import errors
from llmgw import strict

FLEET = "/llmgw.fleet.v1.FleetService/"
AGENT = "/llmgw.agent.v1.AgentService/"

PUBLIC_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Services anyone reaching the port may call: a load balancer's health check and grpcurl's
discovery carry no credentials (reflection describes the API, it reads no fleet state)."""


class Role(enum.IntEnum):
    """A caller's role; a higher one includes every lower one."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        """The role's name in the settings file."""
        return self.name.lower()


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


def short(method: str) -> str:
    """`CreateModel` from `/llmgw.fleet.v1.FleetService/CreateModel`."""
    return method.rsplit("/", 1)[-1]


def is_public(method: str) -> bool:
    """Whether an RPC needs no caller at all."""
    return method.startswith(PUBLIC_PREFIXES)


# -- who calls -------------------------------------------------------------------------------

USER = "user"
NODE = "node"
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    """Who makes a call, as the transport established it.

    `kind` is "user" or "node" for a verified identity (a client certificate's SPIFFE ID, or a
    bearer token's name: always a user), "anonymous" for none. `how` says which: "certificate",
    "token" or "none". `acting_for` is the person a gateway names (honoured only for gateways).
    `claimed` is what `x-llmgw-caller` said when nothing could be verified (dev mode), kept for
    the audit trail as today."""

    kind: str
    name: str = ""
    how: str = "none"
    acting_for: str = ""
    claimed: str = ""
    peer: str = ""
    serial: str = ""
    """The client certificate's serial number (lower-case hex), when it came by one."""
    fingerprint: str = ""
    """The client certificate's SHA-256 fingerprint (lower-case hex), when it came by one."""
    token_sha256: str = ""
    """The hash of the bearer token it came by (hex), to check it again while a stream runs."""

    @property
    def identity(self) -> str:
        """`user:alice`, `node:gpu-1` or `anonymous`."""
        return f"{self.kind}:{self.name}" if self.kind != ANONYMOUS else ANONYMOUS

    @property
    def audit_name(self) -> str:
        """What `by`, `updated_by` and `created_by` record: the verified name (`alice`), a
        gateway's with its person (`gateway for alice`); without verification (dev mode) the
        caller's own claim, else `anonymous@PEER`, as before authentication existed."""
        if self.kind == ANONYMOUS:
            return self.claimed or f"anonymous@{self.peer}"
        name = self.name if self.kind == USER else f"node:{self.name}"
        return f"{name} for {self.acting_for}" if self.acting_for else name


# -- the roles file --------------------------------------------------------------------------

EVERYONE = "*"


@dataclass(frozen=True)
class Roles:
    """Users' roles as the cluster settings give them.

    `members` maps a user name to its highest role; `everyone` is the role of every verified
    user not listed (`"*"` under a role); `gateways` may act for others; `revoked` lists
    identities (`user:NAME`, `node:NAME`) refused whatever their certificate or token."""

    members: Mapping[str, Role] = field(default_factory=dict)
    everyone: Role | None = None
    gateways: frozenset[str] = frozenset()
    revoked: frozenset[str] = frozenset()
    source: str = "defaults"

    def role_of(self, user: str) -> Role | None:
        """A user's role (None: none)."""
        own = self.members.get(user)
        if self.everyone is not None and (own is None or own < self.everyone):
            return self.everyone
        return own

    def may_act_for_others(self, user: str) -> bool:
        """Whether `user`'s `x-llmgw-caller` names the person it acts for."""
        return user in self.gateways

    def revocation(self, caller: Caller) -> str:
        """Which `revoked:` entry shuts `caller` out ("" for none): its identity, its
        certificate's serial or fingerprint, or the person a gateway acts for."""
        if caller.kind == ANONYMOUS:
            return ""
        for entry in (
            caller.identity,
            f"serial:{caller.serial}" if caller.serial else "",
            f"sha256:{caller.fingerprint}" if caller.fingerprint else "",
            f"{USER}:{caller.acting_for}" if caller.acting_for else "",
        ):
            if entry and entry in self.revoked:
                return entry
        return ""

    def summary(self) -> dict[str, object]:
        """How many hold each role, for the start-up log."""
        counts = {r.label: sum(1 for v in self.members.values() if v is r) for r in Role}
        return {
            **counts,
            "everyone": self.everyone.label if self.everyone else "",
            "gateways": sorted(self.gateways),
            "revoked": len(self.revoked),
            "from": self.source,
        }


DEFAULT_ROLES = Roles(
    members={"admin": Role.ADMIN, "viewer": Role.VIEWER},
    source="defaults (user admin is admin, user viewer is viewer: the pairs `llmgw up` makes)",
)
"""The roles when the settings have no `roles:` section."""

_ROLE_KEYS = {r.label: r for r in Role}
_OTHER_KEYS = ("gateway", "revoked")


def _names(value: object, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise errors.InvalidModel(f"roles.{key} is a list of names", field=f"roles.{key}")
    return list(value)


_HEX = frozenset("0123456789abcdef")


def _revoked_entry(item: str) -> str:
    """A `revoked:` entry in its compared form: `user:NAME`, `node:NAME`, `serial:HEX` or
    `sha256:HEX` (hex lower-cased, `:` separators dropped, leading zeros of a serial too:
    `openssl x509 -serial` and `-fingerprint` print them in capitals, with colons)."""
    kind, _, value = item.partition(":")
    if kind in (USER, NODE) and value:
        return item
    if kind in ("serial", "sha256") and value:
        digits = value.replace(":", "").lower()
        if kind == "serial":
            digits = digits.lstrip("0") or "0"
        if set(digits) <= _HEX and (kind == "serial" or len(digits) == 64):
            return f"{kind}:{digits}"
    raise errors.InvalidModel(
        f"roles.revoked: {item[:80]!r} is not user:NAME, node:NAME, serial:HEX or "
        "sha256:FINGERPRINT (64 hex digits)",
        field="roles.revoked",
    )


def parse_roles(data: object, source: str = "settings") -> Roles:
    """The `roles:` section of the cluster settings:

        roles:
          admin: [alice]
          operator: [bob]
          viewer: [carol, gateway, "*"]   # "*": every verified user
          gateway: [gateway]              # may act for others (x-llmgw-caller)
          revoked: [user:mallory, node:gpu-9]

    A name listed under several roles has the highest. A gateway has no role by being one:
    list it under the role it needs (viewer to watch endpoints).

    Raises:
        InvalidModel: not a mapping of those keys to lists of names.
    """
    if not isinstance(data, Mapping):
        raise errors.InvalidModel("`roles` maps role names to lists of users", field="roles")
    unknown = strict.unknown_keys(data, [*_ROLE_KEYS, *_OTHER_KEYS], "roles")
    if unknown:
        raise errors.InvalidModel("; ".join(unknown), field="roles")
    members: dict[str, Role] = {}
    everyone: Role | None = None
    for key, role in sorted(_ROLE_KEYS.items(), key=lambda kv: kv[1]):
        for name in _names(data.get(key), key):
            if name == EVERYONE:
                everyone = role
            else:
                members[name] = max(role, members.get(name, role))
    revoked = [_revoked_entry(item) for item in _names(data.get("revoked"), "revoked")]
    return Roles(
        members=members,
        everyone=everyone,
        gateways=frozenset(_names(data.get("gateway"), "gateway")),
        revoked=frozenset(revoked),
        source=source,
    )


# -- bearer tokens ---------------------------------------------------------------------------


def token_hash(token: str) -> str:
    """The hex SHA-256 of a token, as the tokens file holds it (`printf %s TOKEN | sha256sum`).

    A plain hash, not a slow one: tokens are random strings of 128 bits or more (not
    passwords), which no dictionary reaches, and each call checks one."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Tokens:
    """Token hashes by user name."""

    hashes: Mapping[str, bytes] = field(default_factory=dict)

    @staticmethod
    def of(pairs: Iterable[tuple[str, str]]) -> Tokens:
        """From (name, hex SHA-256) pairs.

        Raises:
            ValueError: a hash that is not 64 hex digits.
        """
        out: dict[str, bytes] = {}
        for name, hexdigest in pairs:
            try:
                digest = bytes.fromhex(hexdigest)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ValueError(f"the token hash of {name!r} is not 64 hex digits (SHA-256)")
            out[name] = digest
        return Tokens(out)

    def who(self, token: str) -> str | None:
        """The user a token is, None for none. Compares with every entry in constant time
        (hmac.compare_digest), so neither the time taken nor an early exit tells an attacker
        how close a guess came or which entry it resembles."""
        digest = hashlib.sha256(token.encode()).digest()
        found: str | None = None
        for name, expected in self.hashes.items():
            if hmac.compare_digest(digest, expected) and found is None:
                found = name
        return found


# -- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """How the fleet checks calls.

    `auth`: callers must be verified (the fleet has a client CA or a tokens file); False is dev
    mode, where every call is allowed. `node_certificates`: agents must present a node
    certificate (auth is on, or the fleet serves TLS at all: an agent is never anonymous
    behind TLS)."""

    auth: bool
    node_certificates: bool
    roles: Roles = DEFAULT_ROLES
    failure: str = ""
    """Why the roles could not be read again ("" when they were): while set, every call but
    health and reflection is refused (a malformed edit fails closed, never open)."""


def _role_text(role: Role | None) -> str:
    return role.label if role is not None else "none"


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
        has=AGENT_ROLE if caller.kind == NODE else _role_text(role),
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
    if policy.failure:
        raise errors.Unauthenticated(
            f"{rpc} is refused to everyone until the roles are readable again: {policy.failure}",
            rpc=rpc,
        )
    revoked = policy.roles.revocation(caller)
    if revoked:
        whose = caller.identity + (f" for user:{caller.acting_for}" if caller.acting_for else "")
        raise errors.Unauthenticated(
            f"{whose} is revoked in the cluster settings' roles ({revoked})", rpc=rpc
        )
    if need == AGENT_ROLE:
        if not policy.node_certificates and caller.kind == ANONYMOUS:
            return
        if caller.kind == NODE:
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
            has=_role_text(policy.roles.role_of(caller.name)),
        )
    if not policy.auth:
        return
    if need == GATEWAY_ROLE:
        _gateway_only(rpc, caller, policy)
        return
    if need is None:
        raise errors.RoleRequired(
            f"{rpc} is in no role's list: nobody may call it",
            rpc=rpc,
            identity=caller.identity,
            required="none",
        )
    if caller.kind == ANONYMOUS:
        raise errors.Unauthenticated(
            f"{rpc} needs a caller: present a client certificate signed by the fleet's CA or "
            "an `authorization: Bearer TOKEN` the fleet's tokens file knows",
            rpc=rpc,
        )
    assert isinstance(need, Role)
    if caller.kind == NODE:
        raise errors.RoleRequired(
            f"{rpc} needs the {need.label} role: node identities may only Connect",
            rpc=rpc,
            identity=caller.identity,
            required=need.label,
            has=AGENT_ROLE,
        )
    role = policy.roles.role_of(caller.name)
    shown = caller.identity
    if caller.acting_for:
        theirs = policy.roles.role_of(caller.acting_for)
        role = None if role is None or theirs is None else min(role, theirs)
        shown = f"{caller.identity} for user:{caller.acting_for}"
    if role is None or role < need:
        raise errors.RoleRequired(
            f"{rpc} needs the {need.label} role; {shown} has {_role_text(role)}",
            rpc=rpc,
            identity=shown,
            required=need.label,
            has=_role_text(role),
        )
