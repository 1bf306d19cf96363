"""The fleet's access rules (fleet_svc.domain.access) and the tokens file (fleet_svc.rpc.auth):
the role table covers every RPC, roles nest, nodes only Connect, gateways never lift anyone."""

from __future__ import annotations

import pytest

from fleet_svc.domain import errors
from fleet_svc.domain.access import (
    AGENT_ROLE,
    ANONYMOUS,
    DEFAULT_ROLES,
    FLEET,
    MUTATIONS,
    RPC_ROLES,
    Caller,
    Policy,
    Role,
    Tokens,
    decide,
    parse_roles,
    token_hash,
)
from fleet_svc.rpc.auth import parse_tokens
from llmgw.agent.v1 import agent_pb2
from llmgw.fleet.v1 import fleet_pb2

ROLES = parse_roles(
    {
        "admin": ["ada"],
        "operator": ["otto", "gw"],
        "viewer": ["vic", "ada"],
        "gateway": ["gw"],
        "revoked": ["user:mallory", "node:gpu-9"],
    }
)
ON = Policy(auth=True, node_certificates=True, roles=ROLES)
DEV = Policy(auth=False, node_certificates=False, roles=ROLES)


def user(name: str, acting_for: str = "") -> Caller:
    return Caller("user", name, "certificate", acting_for=acting_for)


def node(name: str) -> Caller:
    return Caller("node", name, "certificate")


NOBODY = Caller(ANONYMOUS)


def allowed(method: str, caller: Caller, policy: Policy = ON) -> bool:
    try:
        decide(method, caller, policy)
    except (errors.Unauthenticated, errors.RoleRequired):
        return False
    return True


def test_every_rpc_of_both_services_is_in_the_table() -> None:
    """Each method the protos define has a role, and the table names no other."""
    methods = {
        f"/{service.full_name}/{m.name}"
        for desc in (fleet_pb2.DESCRIPTOR, agent_pb2.DESCRIPTOR)
        for service in desc.services_by_name.values()
        for m in service.methods
    }
    assert set(RPC_ROLES) == methods
    assert set(RPC_ROLES) >= MUTATIONS
    assert all(RPC_ROLES[m] in (Role.OPERATOR, Role.ADMIN) for m in MUTATIONS)


@pytest.mark.parametrize(
    ("rpc", "need"),
    [
        ("ListModels", Role.VIEWER),
        ("WatchReplicas", Role.VIEWER),
        ("WatchRollout", Role.VIEWER),
        ("SetContext", Role.OPERATOR),
        ("SetGPUs", Role.OPERATOR),
        ("CancelRollout", Role.OPERATOR),
        ("UndoRollout", Role.OPERATOR),
        ("CreateModel", Role.ADMIN),
        ("UpdateModel", Role.ADMIN),
        ("DeleteModel", Role.ADMIN),
    ],
)
def test_roles_nest(rpc: str, need: Role) -> None:
    """A role reaches its RPCs and every lower role's; nodes and nobody reach none."""
    method = FLEET + rpc
    assert RPC_ROLES[method] is need
    assert allowed(method, user("vic")) == (need <= Role.VIEWER)
    assert allowed(method, user("otto")) == (need <= Role.OPERATOR)
    assert allowed(method, user("ada"))
    assert not allowed(method, user("stranger"))
    assert not allowed(method, node("gpu-1"))
    with pytest.raises(errors.Unauthenticated):
        decide(method, NOBODY, ON)


def test_a_refusal_names_the_role_needed() -> None:
    with pytest.raises(errors.RoleRequired) as caught:
        decide(FLEET + "DeleteModel", user("otto"), ON)
    assert caught.value.required == "admin"
    assert caught.value.has == "operator"
    assert "admin" in caught.value.message
    assert caught.value.metadata()["required_role"] == "admin"


def test_connect_is_for_node_identities_only() -> None:
    connect = "/llmgw.agent.v1.AgentService/Connect"
    assert RPC_ROLES[connect] == AGENT_ROLE
    assert allowed(connect, node("gpu-1"))
    assert not allowed(connect, user("ada"))
    with pytest.raises(errors.Unauthenticated):
        decide(connect, NOBODY, ON)
    # Over TLS without auth, agents still need a certificate; plaintext dev mode takes them.
    assert not allowed(connect, NOBODY, Policy(auth=False, node_certificates=True))
    assert allowed(connect, NOBODY, DEV)


def test_dev_mode_allows_every_call_but_revoked_identities_stay_out() -> None:
    for method in RPC_ROLES:
        if RPC_ROLES[method] != AGENT_ROLE:
            assert allowed(method, NOBODY, DEV)
    assert not allowed(FLEET + "ListModels", user("mallory"), DEV)
    assert not allowed("/llmgw.agent.v1.AgentService/Connect", node("gpu-9"), DEV)


def test_health_and_reflection_need_nobody_unknown_rpcs_nobody_may_call() -> None:
    assert allowed("/grpc.health.v1.Health/Check", NOBODY)
    assert allowed("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", NOBODY)
    assert not allowed(FLEET + "DropEverything", user("ada"))


def test_a_gateway_gets_no_more_than_both_it_and_its_person_have() -> None:
    """gw (operator) for ada (admin) is an operator; for vic (viewer) a viewer; for someone
    with no role nothing."""
    assert allowed(FLEET + "SetGPUs", user("gw", acting_for="ada"))
    assert not allowed(FLEET + "CreateModel", user("gw", acting_for="ada"))
    assert not allowed(FLEET + "SetGPUs", user("gw", acting_for="vic"))
    assert allowed(FLEET + "ListModels", user("gw", acting_for="vic"))
    assert not allowed(FLEET + "ListModels", user("gw", acting_for="stranger"))
    assert user("gw", acting_for="ada").audit_name == "gw for ada"
    assert ROLES.may_act_for_others("gw") and not ROLES.may_act_for_others("ada")


def test_audit_names() -> None:
    assert user("ada").audit_name == "ada"
    assert Caller(ANONYMOUS, claimed="dev").audit_name == "dev"
    assert Caller(ANONYMOUS, peer="ipv4:127.0.0.1:5").audit_name == "anonymous@ipv4:127.0.0.1:5"


def test_roles_file_forms_and_mistakes() -> None:
    roles = parse_roles({"viewer": ["*"], "admin": ["ada"]})
    assert roles.role_of("anyone") is Role.VIEWER
    assert roles.role_of("ada") is Role.ADMIN
    assert DEFAULT_ROLES.role_of("admin") is Role.ADMIN
    assert DEFAULT_ROLES.role_of("viewer") is Role.VIEWER
    assert DEFAULT_ROLES.role_of("alice") is None
    bads: list[object] = [
        {"admins": ["x"]},
        {"admin": "x"},
        {"admin": [1]},
        {"revoked": ["mallory"]},
        [],
    ]
    for bad in bads:
        with pytest.raises(errors.InvalidModel):
            parse_roles(bad)


def test_tokens_match_by_hash_only() -> None:
    table = Tokens.of([("alice", token_hash("tok-a")), ("bob", token_hash("tok-b"))])
    assert table.who("tok-a") == "alice"
    assert table.who("tok-b") == "bob"
    assert table.who("tok-c") is None
    assert table.who("") is None
    with pytest.raises(ValueError, match="64 hex"):
        Tokens.of([("x", "abc")])


def test_tokens_file_lines_or_yaml() -> None:
    h = token_hash("t")
    assert parse_tokens(f"# c\n\nalice {h}\nbob   {h.upper()}\n").who("t") in ("alice", "bob")
    assert parse_tokens(f"alice: {h}\n").who("t") == "alice"
    for bad in (f"al/ice {h}", "alice nothex", f"- alice {h}"):
        with pytest.raises(ValueError):
            parse_tokens(bad)
