"""What `llmgw up` makes for mutual TLS (llmgw.cli.up_pki): the pairs each child is handed,
kept across runs; the roles file the fleet reads, written once; and where children are
dialled."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleet_svc.domain.access import Role, parse_roles
from llmgw.cli.up_pki import make_pki, server_flags, tls_flags, write_settings
from llmgw.cli.up_plan import dialable
from llmgw.identity import Identity, identity_of_certificate


def identity(path: Path) -> Identity:
    """The llmgw identity of a certificate file."""
    return identity_of_certificate(path.read_bytes())


def test_each_child_gets_its_own_identity_and_a_second_run_keeps_them(tmp_path: Path) -> None:
    """The agent's pair is node NODE, the fleet's channel to the planner user `fleet`, the
    catalog's writer user `llmgw-up`; a second run changes no file."""
    pki = make_pki(tmp_path / "tls", node="gpu-a", host="127.0.0.1")
    assert identity(pki.node[0]) == Identity("node", "gpu-a")
    assert identity(pki.fleet_client[0]) == Identity("user", "fleet")
    assert identity(pki.writer[0]) == Identity("user", "llmgw-up")
    assert identity(pki.admin[0]) == Identity("user", "admin")
    files = {p: p.read_bytes() for p in (tmp_path / "tls").iterdir()}
    again = make_pki(tmp_path / "tls", node="gpu-a", host="127.0.0.1")
    assert again == pki
    assert {p: p.read_bytes() for p in (tmp_path / "tls").iterdir()} == files


def test_the_roles_file_is_the_fleets_and_is_written_once(tmp_path: Path) -> None:
    """The settings `llmgw up` writes parse with the fleet's own reader: admin and llmgw-up are
    admins, viewer a viewer; an edited file is not written over."""
    path = tmp_path / "settings.yaml"
    assert write_settings(path)
    roles = parse_roles(yaml.safe_load(path.read_text())["roles"])
    assert roles.role_of("admin") is Role.ADMIN
    assert roles.role_of("llmgw-up") is Role.ADMIN
    assert roles.role_of("viewer") is Role.VIEWER
    assert roles.role_of("fleet") is None
    path.write_text("roles:\n  admin: [alice]\n")
    assert not write_settings(path)
    assert path.read_text() == "roles:\n  admin: [alice]\n"


def test_flags_hand_each_process_its_files(tmp_path: Path) -> None:
    """A server gets its pair and the client CA; a client its CA and pair, under a prefix."""
    ca, pair = tmp_path / "ca.crt", (tmp_path / "f.crt", tmp_path / "f.key")
    assert server_flags(ca, pair) == [
        "--tls-cert",
        str(pair[0]),
        "--tls-key",
        str(pair[1]),
        "--tls-ca",
        str(ca),
    ]
    assert tls_flags("planner-", ca, pair) == [
        "--planner-tls-ca",
        str(ca),
        "--planner-tls-cert",
        str(pair[0]),
        "--planner-tls-key",
        str(pair[1]),
    ]
    assert tls_flags("", ca, None) == ["--tls-ca", str(ca)]


def test_a_wildcard_listener_is_dialled_on_loopback() -> None:
    """`--host 0.0.0.0` children are dialled at 127.0.0.1 (every server certificate names it);
    other hosts as they are."""
    assert dialable("0.0.0.0:50052") == "127.0.0.1:50052"
    assert dialable("127.0.0.1:50052") == "127.0.0.1:50052"
    assert dialable("fleet.internal:50052") == "fleet.internal:50052"
