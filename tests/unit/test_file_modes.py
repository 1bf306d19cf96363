"""Files that hold what a person should not read are 0600: keys (whatever the umask), the
settings `llmgw up` writes, the store and its journals, the agent's replica logs and the
supervisor's service logs; and `llmgw certs --out` into a shared folder never follows a
symlink planted where its temporary files go."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_svc.agent.logs import ReplicaLog
from fleet_svc.store.sqlite import SQLiteStore
from llmgw import certs
from llmgw.cli.main import main
from llmgw.cli.supervisor import Child
from llmgw.cli.up_pki import write_settings


def mode(path: Path) -> int:
    """A file's permission bits."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A umask of 0 (what a careless shell or container gives): modes must not come from it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_symlinks_planted_in_a_shared_out_folder_are_not_followed(
    tmp_path: Path, loose_umask: None
) -> None:
    """With `.alice.key.tmp` and `.alice.crt.tmp` planted as symlinks to a victim file in the
    --out folder, `llmgw certs client alice --out` writes the pair 0600/0644 and the victim
    is untouched."""
    ca_dir = tmp_path / "tls"
    certs.make_local_tls(ca_dir)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (".alice.key.tmp", ".alice.crt.tmp"):
        (shared / name).symlink_to(victim)
    assert main(["certs", "client", "alice", "--ca-dir", str(ca_dir), "--out", str(shared)]) == 0
    assert victim.read_text() == "precious\n"
    assert mode(shared / "alice.key") == 0o600
    assert mode(shared / "alice.crt") == 0o644
    assert b"PRIVATE KEY" in (shared / "alice.key").read_bytes()
    assert not (shared / "alice.key").is_symlink()


def test_keys_are_0600_whatever_the_umask(tmp_path: Path, loose_umask: None) -> None:
    """Every key `make_local_tls` writes is 0600 under umask 0; certificates 0644."""
    local = certs.make_local_tls(tmp_path / "tls")
    keys = list((tmp_path / "tls").glob("*.key"))
    assert keys and all(mode(k) == 0o600 for k in keys), [(k.name, oct(mode(k))) for k in keys]
    assert mode(local.ca_cert) == 0o644


def test_settings_store_and_logs_are_0600(tmp_path: Path, loose_umask: None) -> None:
    """The settings file, the SQLite store with its -wal and -shm, a replica's log and its
    rotated copy, and a supervised service's log are all 0600 under umask 0."""
    settings = tmp_path / "settings.yaml"
    assert write_settings(settings)
    assert mode(settings) == 0o600

    store = SQLiteStore(tmp_path / "fleet.db")
    store.put_value("probe", "x")
    journals = [tmp_path / "fleet.db", *tmp_path.glob("fleet.db-*")]
    modes = [(p.name, oct(mode(p))) for p in journals]
    store.close()
    assert len(journals) >= 2, journals
    assert all(m == "0o600" for _, m in modes), modes

    log = ReplicaLog(tmp_path / "logs", "r1", max_bytes=10)
    os.close(log.open_for_engine())
    log.note("started with a long enough line to pass the cap")
    assert log.cap()
    assert mode(log.path) == 0o600
    assert mode(log.path.with_name("r1.log.1")) == 0o600

    child = Child("svc", ["true"], tmp_path / "svc.log", 1.0, "test")
    child.start(dict(os.environ))
    assert child.proc is not None
    child.proc.wait(timeout=10)
    assert child.log_file is not None
    child.log_file.close()
    assert mode(tmp_path / "svc.log") == 0o600


def test_an_existing_store_is_made_private(tmp_path: Path) -> None:
    """A store file left 0644 by an older fleet is 0600 once opened again."""
    store = SQLiteStore(tmp_path / "fleet.db")
    store.close()
    os.chmod(tmp_path / "fleet.db", 0o644)
    SQLiteStore(tmp_path / "fleet.db").close()
    assert mode(tmp_path / "fleet.db") == 0o600
