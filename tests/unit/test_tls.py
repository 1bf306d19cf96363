"""llmgw.identity and llmgw.tls, their pure parts: identities, where plaintext may listen, the
TLS settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmgw import certs
from llmgw.identity import (
    Identity,
    IdentityError,
    identity_of_certificate,
    identity_of_uris,
    node_uri,
    parse_identity,
    user_uri,
)
from llmgw.tls import (
    ENV_CA,
    ENV_CERT,
    ENV_KEY,
    ClientTLS,
    ServerTLS,
    TLSConfigError,
    add_client_tls_arguments,
    add_server_tls_arguments,
    check_listen,
    client_tls,
    client_tls_from_args,
    is_loopback,
    listen_host,
    local_client_tls,
    server_tls_from_args,
)


@pytest.mark.parametrize(
    ("uri", "identity"),
    [
        ("spiffe://llmgw/node/gpu-1", Identity("node", "gpu-1")),
        ("spiffe://llmgw/node/local", Identity("node", "local")),
        ("spiffe://llmgw/user/admin", Identity("user", "admin")),
        ("spiffe://llmgw/user/gateway.prod_2", Identity("user", "gateway.prod_2")),
    ],
)
def test_identities_parse_from_their_spiffe_ids(uri: str, identity: Identity) -> None:
    """spiffe://llmgw/node/NAME and spiffe://llmgw/user/NAME name a node and a user."""
    assert parse_identity(uri) == identity
    assert identity.uri == uri


@pytest.mark.parametrize(
    "uri",
    [
        "spiffe://other/node/gpu-1",
        "spiffe://llmgw.evil/node/gpu-1",
        "spiffe://llmgw/admin/root",
        "spiffe://llmgw/node/",
        "spiffe://llmgw/node/a/b",
        "spiffe://llmgw/node/..",
        "spiffe://llmgw/node/-x",
        "spiffe://llmgw/node/gpu-1?x=1",
        "spiffe://llmgw/node/gpu-1#frag",
        "spiffe://llmgw/user/" + "a" * 64,
        "https://llmgw/node/gpu-1",
        "SPIFFE://llmgw/node/gpu-1",
        "spiffe://llmgw/node/gpu 1",
        "",
    ],
)
def test_anything_else_is_no_identity(uri: str) -> None:
    """Other trust domains, kinds, extra segments, queries, bad names: IdentityError."""
    with pytest.raises(IdentityError):
        parse_identity(uri)


def test_a_certificate_is_exactly_one_peer() -> None:
    """No URI SAN or several is refused (X.509-SVID: exactly one)."""
    assert identity_of_uris(["spiffe://llmgw/node/a"]) == Identity("node", "a")
    for uris in ([], ["spiffe://llmgw/node/a", "spiffe://llmgw/user/a"]):
        with pytest.raises(IdentityError, match="exactly one"):
            identity_of_uris(uris)


def test_certificates_issued_carry_their_identity() -> None:
    """A node pair reads as that node, a client pair as that user, a server pair as none."""
    ca = certs.new_authority()
    assert identity_of_certificate(certs.issue_node(ca, "gpu-7").cert_pem) == Identity(
        "node", "gpu-7"
    )
    assert identity_of_certificate(certs.issue_client(ca, "viewer").cert_pem) == Identity(
        "user", "viewer"
    )
    with pytest.raises(IdentityError):
        identity_of_certificate(certs.issue_server(ca, "planner").cert_pem)
    with pytest.raises(IdentityError):
        identity_of_certificate(b"not a certificate")


def test_names_are_checked_when_uris_are_made() -> None:
    """node_uri and user_uri refuse a name no certificate should carry."""
    assert node_uri("n1") == "spiffe://llmgw/node/n1"
    assert user_uri("alice") == "spiffe://llmgw/user/alice"
    for bad in ("", "a/b", "..", "-a", "a b", "x" * 64):
        with pytest.raises(IdentityError):
            node_uri(bad)


@pytest.mark.parametrize(
    ("listen", "host", "loopback"),
    [
        ("127.0.0.1:50051", "127.0.0.1", True),
        ("127.9.9.9:0", "127.9.9.9", True),
        ("localhost:50051", "localhost", True),
        ("[::1]:50051", "::1", True),
        ("unix:/run/llmgw.sock", "unix", True),
        ("0.0.0.0:50051", "0.0.0.0", False),
        ("[::]:50051", "::", False),
        (":50051", "", False),
        ("10.0.0.5:50051", "10.0.0.5", False),
        ("planner.internal:50051", "planner.internal", False),
    ],
)
def test_loopback_is_told_from_the_listen_address(listen: str, host: str, loopback: bool) -> None:
    """Only 127/8, ::1, localhost and unix sockets are loopback; wildcards and names are not."""
    assert listen_host(listen) == host
    assert is_loopback(host) is loopback


def test_plaintext_off_loopback_needs_insecure(tmp_path: Path) -> None:
    """Without certificates: loopback is plaintext, elsewhere refused unless --insecure;
    with certificates: TLS, mutual when a CA is given."""
    assert check_listen("127.0.0.1:0", None) == "plaintext-loopback"
    with pytest.raises(TLSConfigError, match="--insecure"):
        check_listen("0.0.0.0:50051", None)
    assert check_listen("0.0.0.0:50051", None, insecure=True) == "plaintext-insecure"
    pair = ServerTLS(tmp_path / "s.crt", tmp_path / "s.key")
    assert check_listen("0.0.0.0:50051", pair) == "tls"
    mutual = ServerTLS(tmp_path / "s.crt", tmp_path / "s.key", tmp_path / "ca.crt")
    assert check_listen("0.0.0.0:50051", mutual) == "mtls"


def _server_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_tls_arguments(parser)
    return parser.parse_args(list(argv))


def test_server_flags_go_together() -> None:
    """--tls-cert and --tls-key come as a pair; --tls-ca needs them; none is plaintext."""
    assert server_tls_from_args(_server_args()) is None
    tls = server_tls_from_args(_server_args("--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"))
    assert tls == ServerTLS(Path("c"), Path("k"), Path("a")) and tls.mutual
    for argv in (("--tls-cert", "c"), ("--tls-key", "k"), ("--tls-ca", "a")):
        with pytest.raises(TLSConfigError):
            server_tls_from_args(_server_args(*argv))


def test_client_settings_come_from_flags_then_the_environment() -> None:
    """Each flag wins over its LLMGW_TLS_* variable; nothing at all is plaintext; a cert
    without its key is refused."""
    env = {ENV_CA: "/e/ca.crt", ENV_CERT: "/e/me.crt", ENV_KEY: "/e/me.key"}
    assert client_tls(env={}) is None
    assert client_tls(env=env) == ClientTLS(Path("/e/ca.crt"), Path("/e/me.crt"), Path("/e/me.key"))
    assert client_tls("/f/ca.crt", env=env) == ClientTLS(
        Path("/f/ca.crt"), Path("/e/me.crt"), Path("/e/me.key")
    )
    assert client_tls(env={ENV_CA: "/e/ca.crt"}) == ClientTLS(ca=Path("/e/ca.crt"))
    with pytest.raises(TLSConfigError, match="go together"):
        client_tls(cert="/f/me.crt", env={})
    parser = argparse.ArgumentParser()
    add_client_tls_arguments(parser)
    opts = parser.parse_args(["--tls-ca", "/f/ca.crt"])
    assert client_tls_from_args(opts) == ClientTLS(ca=Path("/f/ca.crt"))


def test_the_local_admin_pair_is_found_only_when_whole(tmp_path: Path) -> None:
    """local_client_tls finds DATA/tls's admin pair once ca.crt, admin.crt and admin.key exist."""
    assert local_client_tls(tmp_path) is None
    certs.make_local_tls(tmp_path)
    assert local_client_tls(tmp_path) == ClientTLS(
        tmp_path / "ca.crt", tmp_path / "admin.crt", tmp_path / "admin.key"
    )
    (tmp_path / "viewer.key").unlink()
    assert local_client_tls(tmp_path, "viewer") is None
