"""`llmgw certs node|client NAME`: a pair issued from the CA folder, naming the identity it
is for, written where asked, its paths as JSON for scripts; a bad name or a folder with no CA
is bad usage (64) and writes nothing."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography import x509

from llmgw import certs
from llmgw.cli.main import main
from llmgw.identity import Identity, identity_of_certificate


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    """A CA folder as `llmgw up` leaves it."""
    folder = tmp_path / "data" / "tls"
    certs.make_local_tls(folder)
    return folder


def issuer_of(path: Path) -> x509.Name:
    """The issuer of a PEM certificate file."""
    return x509.load_pem_x509_certificate(path.read_bytes()).issuer


def test_a_node_pair_is_issued_for_that_node(
    ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`certs node gpu-2` writes node-gpu-2.crt/.key beside the CA, signed by it, identity
    node gpu-2, the key private; it says the agent's flags."""
    assert main(["certs", "node", "gpu-2", "--ca-dir", str(ca_dir)]) == 0
    cert, key = ca_dir / "node-gpu-2.crt", ca_dir / "node-gpu-2.key"
    assert identity_of_certificate(cert.read_bytes()) == Identity("node", "gpu-2")
    assert issuer_of(cert) == issuer_of(ca_dir / "ca.crt")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    out = capsys.readouterr().out
    assert "spiffe://llmgw/node/gpu-2" in out
    assert f"--tls-ca {ca_dir / 'ca.crt'} --tls-cert {cert} --tls-key {key}" in out


def test_a_client_pair_goes_where_asked_and_prints_its_paths(
    ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`certs client alice --out DIR --json` writes alice.crt/.key under DIR (made if need
    be), identity user alice, and prints the paths and the CA as JSON."""
    out_dir = tmp_path / "alice"
    code = main(
        ["certs", "client", "alice", "--ca-dir", str(ca_dir), "--out", str(out_dir), "--json"]
    )
    assert code == 0
    said = json.loads(capsys.readouterr().out)
    assert said == {
        "kind": "client",
        "identity": "spiffe://llmgw/user/alice",
        "cert": str(out_dir / "alice.crt"),
        "key": str(out_dir / "alice.key"),
        "ca": str(ca_dir / "ca.crt"),
    }
    assert identity_of_certificate(Path(said["cert"]).read_bytes()) == Identity("user", "alice")
    assert not (ca_dir / "alice.crt").exists()


def test_issuing_again_renews_the_pair(ca_dir: Path) -> None:
    """A second `certs client` for the same name writes a new pair over the old one."""
    assert main(["certs", "client", "bob", "--ca-dir", str(ca_dir)]) == 0
    first = (ca_dir / "bob.crt").read_bytes()
    assert main(["certs", "client", "bob", "--ca-dir", str(ca_dir)]) == 0
    assert (ca_dir / "bob.crt").read_bytes() != first


def test_the_ca_folder_defaults_to_llmgw_ups(ca_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --ca-dir the CA is DATA/tls: $LLMGW_DATA's, else ./data's."""
    monkeypatch.setenv("LLMGW_DATA", str(ca_dir.parent))
    assert main(["certs", "node", "gpu-3"]) == 0
    assert (ca_dir / "node-gpu-3.crt").is_file()
    monkeypatch.delenv("LLMGW_DATA")
    monkeypatch.chdir(ca_dir.parent.parent)
    assert main(["certs", "node", "gpu-4"]) == 0
    assert (ca_dir / "node-gpu-4.crt").is_file()


@pytest.mark.parametrize("name", ["../etc", "-rf", "a/b", "x" * 64, ""])
def test_a_name_that_cannot_be_an_identity_is_bad_usage(
    ca_dir: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name that is not 1-63 identity characters exits 64 saying so; nothing is written."""
    before = sorted(p.name for p in ca_dir.iterdir())
    assert main(["certs", "client", "--ca-dir", str(ca_dir), "--", name]) == 64
    assert "cannot be an identity" in capsys.readouterr().err
    assert sorted(p.name for p in ca_dir.iterdir()) == before


def test_a_folder_without_a_ca_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ca-dir naming a folder with no ca.crt/ca.key exits 64 naming what is missing, and
    makes no CA there."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["certs", "node", "gpu-2", "--ca-dir", str(empty)]) == 64
    assert "holds no CA" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


def test_a_missing_kind_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """`llmgw certs` alone, or an unknown kind, exits 64."""
    for argv in (["certs"], ["certs", "server", "x"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 64
