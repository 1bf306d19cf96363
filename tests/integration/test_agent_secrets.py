"""Secret references in the agent's config (fleet_svc.agent.secrets): an engine's HF_TOKEN
from a mounted file or the agent's environment reaches the engine process, is read again at
each start, and appears in no log or report; one that cannot be resolved keeps the engine
from starting, saying which variable and where, without a value."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleet_svc.agent.cards import StandinCards, parse_gpu_spec
from fleet_svc.agent.config import ConfigError
from fleet_svc.agent.config_file import parse_engine
from fleet_svc.agent.replica import ReplicaSpec
from fleet_svc.agent.replicas import ReplicaSet
from fleet_svc.agent.secrets import SecretError, SecretRef, parse_env_value
from llmgw.testing.eventually import assert_eventually
from tests.support.agents import fast_config

SECRET = "hf_s3cr3tTokenValue0123456789"

# An "engine" that writes the HF_TOKEN it was given to $OUT and then waits to be stopped.
ENGINE = (
    sys.executable,
    "-c",
    "import os, sys, time; open(os.environ['OUT'], 'w').write(os.environ.get('HF_TOKEN', '')); "
    "time.sleep(120)",
)


def _replicas(tmp_path: Path, ref: SecretRef) -> ReplicaSet:
    """A replica set whose one engine records the HF_TOKEN it gets, given by `ref`."""
    base = fast_config().engines["standin"]
    engine = replace(
        base,
        program=ENGINE,
        template=(),
        module="",
        env={"OUT": str(tmp_path / "seen")},
        secret_env={"HF_TOKEN": ref},
    )
    config = replace(fast_config(), engines={"standin": engine})
    cards = StandinCards(parse_gpu_spec("1xL4-24GB"), tmp_path / "state")
    return ReplicaSet(config, cards, tmp_path / "state")


async def test_a_file_secret_reaches_the_engine_and_no_log(tmp_path: Path) -> None:
    """HF_TOKEN given as from_file is in the engine's environment; neither the replica's log
    nor its reported state holds the value."""
    secret = tmp_path / "hf-token"
    secret.write_text(SECRET + "\n")
    replicas = _replicas(tmp_path, SecretRef("file", str(secret)))
    try:
        replicas.apply([ReplicaSpec("r1", 1, "standin", "m", "p", gpus=(0,))])
        seen = tmp_path / "seen"
        await assert_eventually(lambda: (seen.exists() and seen.read_text()) or None, timeout_s=30)
        assert seen.read_text() == SECRET
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "state").rglob("*.log"))
        assert SECRET not in logs
        assert all(SECRET not in repr(obs) for obs in replicas.observed())
    finally:
        await replicas.aclose()


async def test_an_unresolvable_secret_keeps_the_engine_from_starting(tmp_path: Path) -> None:
    """A from_env variable the agent does not have: no engine process, and the replica's
    message names HF_TOKEN and the variable it was to come from."""
    replicas = _replicas(tmp_path, SecretRef("env", "LLMGW_TEST_NO_SUCH_VARIABLE"))
    try:
        replicas.apply([ReplicaSpec("r1", 1, "standin", "m", "p", gpus=(0,))])

        def refused() -> str | None:
            messages = [obs.message for obs in replicas.observed() if obs.message]
            return messages[0] if messages else None

        message = await assert_eventually(refused, timeout_s=30)
        assert "HF_TOKEN" in message and "LLMGW_TEST_NO_SUCH_VARIABLE" in message
        assert not (tmp_path / "seen").exists()
    finally:
        await replicas.aclose()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"from_file": "relative/path"}, "absolute path"),
        ({"from_env": "NOT A NAME"}, "variable name"),
        ({"from_env": "A", "from_file": "/b"}, "exactly one"),
        ({"from_vault": "x"}, "exactly one"),
        ({"from_file": ""}, "a name or a path"),
    ],
)
def test_malformed_references_are_refused(value: object, message: str) -> None:
    """A reference that is not exactly one of from_env: NAME or from_file: /PATH is refused
    when the config is read, naming the variable."""
    with pytest.raises(SecretError, match=message):
        parse_env_value("HF_TOKEN", value, "engines.vllm")


def test_the_config_keeps_literals_and_references_apart() -> None:
    """`env:` literals stay literals (as before); references are kept as references, never
    resolved while the config is read; a bad one is a ConfigError naming the engine."""
    engine = parse_engine(
        "vllm",
        {
            "module": "fleet_svc.standin",
            "env": {"VLLM_NO_USAGE_STATS": "1", "HF_TOKEN": {"from_file": "/run/secrets/hf"}},
        },
    )
    assert engine.env == {"VLLM_NO_USAGE_STATS": "1"}
    assert engine.secret_env == {"HF_TOKEN": SecretRef("file", "/run/secrets/hf")}
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        parse_engine("vllm", {"module": "fleet_svc.standin", "env": {"HF_TOKEN": {"x": 1}}})
