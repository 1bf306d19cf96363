"""How a client command (`llmgw ctl`, `llmgw plan`) finds its credentials: flags over
LLMGW_TLS_*, then the admin pair of a local `llmgw up` (./data/tls or $LLMGW_DATA/tls), else
plaintext; a token with it; a half-given pair is bad usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw import certs
from llmgw.cli.common import Credentials, UsageError, credentials
from llmgw.cli.main import build_parser
from llmgw.tls import ClientTLS


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No client settings from the environment, and a working directory with no data/."""
    for name in ("LLMGW_TLS_CA", "LLMGW_TLS_CERT", "LLMGW_TLS_KEY", "LLMGW_TOKEN", "LLMGW_DATA"):
        monkeypatch.delenv(name, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


def ctl(*flags: str) -> Credentials:
    """The credentials of `llmgw ctl FLAGS model list`."""
    return credentials(build_parser().parse_args(["ctl", *flags, "model", "list"]))


def plan(*flags: str) -> Credentials:
    """The credentials of `llmgw plan FLAGS describe hf://a/b`."""
    return credentials(build_parser().parse_args(["plan", *flags, "describe", "hf://a/b"]))


def local_up(data: Path) -> certs.LocalTLS:
    """The DATA/tls a `llmgw up --data DATA` writes."""
    return certs.make_local_tls(data / "tls")


def test_nothing_given_nothing_found_is_plaintext() -> None:
    """No flag, no variable, no data/tls: no TLS, no token."""
    got = ctl()
    assert (got.tls, got.token, got.found) == (None, "", "")


def test_beside_llmgw_up_the_admin_pair_is_found(tmp_path: Path) -> None:
    """With ./data/tls as `llmgw up` writes it, both commands take its CA and admin pair."""
    local = local_up(Path("data"))
    admin = ClientTLS(
        ca=local.ca_cert, cert=local.clients["admin"][0], key=local.clients["admin"][1]
    )
    for got in (ctl(), plan()):
        assert got.tls == admin
        assert got.found == "data/tls"


def test_llmgw_data_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$LLMGW_DATA points at an `llmgw up --data` elsewhere."""
    local = local_up(tmp_path / "elsewhere")
    monkeypatch.setenv("LLMGW_DATA", str(tmp_path / "elsewhere"))
    got = ctl().tls
    assert got is not None and got.cert == local.clients["admin"][0]


def test_flags_win_over_the_environment_and_the_local_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--tls-* win over LLMGW_TLS_*, which win over data/tls; given either, the local pair is
    not looked at."""
    local_up(Path("data"))
    monkeypatch.setenv("LLMGW_TLS_CA", "/env/ca.crt")
    got = ctl()
    assert got.tls == ClientTLS(ca=Path("/env/ca.crt")) and got.found == "flags"
    got = ctl("--tls-ca", "/flag/ca.crt", "--tls-cert", "/flag/c.crt", "--tls-key", "/flag/c.key")
    assert got.tls == ClientTLS(
        ca=Path("/flag/ca.crt"), cert=Path("/flag/c.crt"), key=Path("/flag/c.key")
    )


def test_flags_after_the_command_count_too() -> None:
    """`llmgw ctl model list --tls-ca X` is the same as `llmgw ctl --tls-ca X model list`."""
    opts = build_parser().parse_args(
        ["ctl", "model", "list", "--tls-ca", "/x/ca.crt", "--token", "t"]
    )
    got = credentials(opts)
    assert got.tls == ClientTLS(ca=Path("/x/ca.crt")) and got.token == "t"


def test_a_token_takes_only_the_local_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a token (--token or LLMGW_TOKEN), the local CA is trusted but the admin pair is not
    presented: the token says who calls."""
    local = local_up(Path("data"))
    got = plan("--token", "abc")
    assert got.tls == ClientTLS(ca=local.ca_cert) and got.token == "abc"
    monkeypatch.setenv("LLMGW_TOKEN", "from-env")
    assert ctl().token == "from-env"


def test_half_a_pair_is_bad_usage() -> None:
    """A certificate without its key is refused before anything is dialled."""
    with pytest.raises(UsageError, match="go together"):
        ctl("--tls-cert", "/x/c.crt")


def test_plaintext_turns_the_local_pair_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--plaintext` (before or after the command) speaks plaintext even beside `llmgw up` or
    with LLMGW_TLS_* set; with a TLS flag it is bad usage."""
    local_up(Path("data"))
    monkeypatch.setenv("LLMGW_TLS_CA", "/env/ca.crt")
    assert ctl("--plaintext").tls is None
    opts = build_parser().parse_args(["ctl", "model", "list", "--plaintext"])
    assert credentials(opts).tls is None
    assert plan("--plaintext").tls is None
    with pytest.raises(UsageError, match="contradict"):
        ctl("--plaintext", "--tls-ca", "/x/ca.crt")
