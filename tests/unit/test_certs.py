"""llmgw.certs: the local CA, its files and modes, and the pairs it issues."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw import certs


def load(pem: bytes) -> x509.Certificate:
    """A PEM certificate, parsed."""
    return x509.load_pem_x509_certificate(pem)


def sans(cert: x509.Certificate) -> list[str]:
    """A certificate's SAN entries as text."""
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        [str(v) for v in ext.get_values_for_type(x509.DNSName)]
        + [str(v) for v in ext.get_values_for_type(x509.IPAddress)]
        + list(ext.get_values_for_type(x509.UniformResourceIdentifier))
    )


def usages(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    """The extended key usages."""
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def mode(path: Path) -> int:
    """The permission bits of a file."""
    return stat.S_IMODE(path.stat().st_mode)


def test_a_ca_is_made_once_with_its_key_private(tmp_path: Path) -> None:
    """init_ca writes ca.crt and ca.key (0600) and loads the same CA when called again."""
    folder = tmp_path / "tls"
    ca = certs.init_ca(folder)
    assert mode(folder / "ca.key") == 0o600
    assert mode(folder) == 0o700
    again = certs.init_ca(folder)
    assert again.cert == ca.cert
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca


def test_pairs_name_what_they_are_for(tmp_path: Path) -> None:
    """A server pair names localhost, 127.0.0.1, its hosts and its service (fleet.service.llmgw)
    for server use; node and client
    pairs carry their SPIFFE ID for client use; each is signed by the CA."""
    ca = certs.new_authority()
    server = load(certs.issue_server(ca, "fleet", hosts=["fleet.internal", "10.0.0.5"]).cert_pem)
    assert sans(server) == [
        "localhost",
        "fleet.internal",
        "fleet.service.llmgw",
        "127.0.0.1",
        "10.0.0.5",
    ]
    assert usages(server) == {ExtendedKeyUsageOID.SERVER_AUTH}
    node = load(certs.issue_node(ca, "gpu-1").cert_pem)
    assert sans(node) == ["spiffe://llmgw/node/gpu-1"]
    assert usages(node) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    user = load(certs.issue_client(ca, "alice").cert_pem)
    assert sans(user) == ["spiffe://llmgw/user/alice"]
    for cert in (server, node, user):
        assert cert.issuer == ca.cert.subject
        cert.verify_directly_issued_by(ca.cert)


def test_bad_names_and_empty_certificates_are_refused() -> None:
    """A node name that is no identity, or a certificate with no use or no SAN, is refused."""
    ca = certs.new_authority()
    with pytest.raises(ValueError):
        certs.issue_node(ca, "../evil")
    with pytest.raises(certs.CertError):
        certs.issue(ca, "x", dns_or_ips=["a"])
    with pytest.raises(certs.CertError):
        certs.issue(ca, "x", client=True)


def test_validity_can_be_set_in_the_past() -> None:
    """Tests issue expired certificates by giving not_after."""
    ca = certs.new_authority()
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    old = load(
        certs.issue(
            ca,
            "old",
            uris=["spiffe://llmgw/user/old"],
            client=True,
            not_before=past - datetime.timedelta(days=2),
            not_after=past,
        ).cert_pem
    )
    assert old.not_valid_after_utc < datetime.datetime.now(datetime.UTC)


def test_local_tls_is_laid_out_for_llmgw_up_and_kept(tmp_path: Path) -> None:
    """make_local_tls writes the CA, a pair per service, the agent's and admin/viewer, keys
    0600; a second run keeps every file as it was."""
    made = certs.make_local_tls(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(
        ["ca.crt", "ca.key"]
        + [
            f"{stem}.{ext}"
            for stem in ("planner", "fleet", "node-local", "admin", "viewer")
            for ext in ("crt", "key")
        ]
    )
    assert all(mode(p) == 0o600 for p in tmp_path.glob("*.key"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = certs.make_local_tls(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert again.clients["admin"] == made.clients["admin"]


def test_local_tls_refuses_roles_that_would_share_files(tmp_path: Path) -> None:
    """A caller named like a server (`fleet`), `node-X` beside node X, or anything named
    `ca` is a CertError naming both roles, and nothing is written; distinct names are fine."""
    clashes: list[tuple[dict[str, tuple[str, ...]], str]] = [
        ({"clients": ("admin", "fleet")}, "client 'fleet' and server 'fleet'"),
        ({"nodes": ("gpu-1",), "clients": ("node-gpu-1",)}, "client 'node-gpu-1' and node"),
        ({"servers": ("ca",)}, "server 'ca' and the CA"),
        ({"clients": ("ca",)}, "client 'ca' and the CA"),
    ]
    for i, (roles, message) in enumerate(clashes):
        folder = tmp_path / str(i)
        with pytest.raises(certs.CertError, match=message):
            certs.make_local_tls(folder, **roles)
        assert not folder.exists()
    made = certs.make_local_tls(tmp_path / "ok", clients=("fleet-client", "admin", "admin"))
    (client_cert, _key) = made.clients["fleet-client"]
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages(load(client_cert.read_bytes()))
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages(load(made.servers["fleet"][0].read_bytes()))


def test_issuing_never_writes_over_another_roles_pair(tmp_path: Path) -> None:
    """`llmgw certs client fleet` in DATA/tls would replace the fleet's server pair, `client
    ca` the CA: both refused with the files untouched; a caller's pair over another caller's
    too; issuing the same caller again rotates its pair."""
    made = certs.make_local_tls(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(certs.CertError, match=r"fleet\.crt holds the certificate of a server"):
        certs.issue_client_files("fleet", tmp_path)
    with pytest.raises(certs.CertError, match="names the CA's own files"):
        certs.issue_client_files("ca", tmp_path)
    with pytest.raises(certs.CertError, match="spiffe://llmgw/user/admin"):
        certs.write_pair(tmp_path, "admin", certs.issue_client(certs.load_ca(tmp_path), "eve"))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert certs.issue_client_files("admin", tmp_path) == made.clients["admin"]
    assert made.clients["admin"][0].read_bytes() != before["admin.crt"]


def test_the_cli_functions_issue_from_an_existing_ca(tmp_path: Path) -> None:
    """`llmgw certs node|client NAME --ca-dir DIR` write pairs signed by the CA in DIR; a
    folder without a CA is a CertError saying so."""
    ca = certs.init_ca(tmp_path)
    cert_path, key_path = certs.issue_node_files("gpu-2", tmp_path)
    assert (cert_path.name, key_path.name) == ("node-gpu-2.crt", "node-gpu-2.key")
    load(cert_path.read_bytes()).verify_directly_issued_by(ca.cert)
    out = tmp_path / "out"
    cert_path, key_path = certs.issue_client_files("bob", tmp_path, out)
    assert cert_path == out / "bob.crt" and mode(key_path) == 0o600
    with pytest.raises(certs.CertError, match="holds no CA"):
        certs.issue_client_files("bob", tmp_path / "empty")
    (tmp_path / "ca.key").write_bytes(certs.new_authority().key_pem)
    with pytest.raises(certs.CertError, match="not the key"):
        certs.load_ca(tmp_path)


def test_a_server_pair_is_rotated_in_place(tmp_path: Path) -> None:
    """issue_server_files rewrites NAME.crt/.key with a new key signed by the same CA."""
    made = certs.make_local_tls(tmp_path, servers=("planner",))
    cert_path, key_path = made.servers["planner"]
    old_cert, old_key = cert_path.read_bytes(), key_path.read_bytes()
    assert certs.issue_server_files("planner", tmp_path, hosts=["p.internal"]) == (
        cert_path,
        key_path,
    )
    new = load(cert_path.read_bytes())
    assert cert_path.read_bytes() != old_cert and key_path.read_bytes() != old_key
    assert "p.internal" in sans(new) and mode(key_path) == 0o600
    new.verify_directly_issued_by(certs.load_ca(tmp_path).cert)
