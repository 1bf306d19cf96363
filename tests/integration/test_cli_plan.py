"""`llmgw plan` as operators run it: a real planner, the real command in a child process;
over mutual TLS with the flags, the environment, or the pair of a local `llmgw up`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from llmgw import certs
from llmgw.tls import ClientTLS, ServerTLS
from tests.support.json_keys import camel_keys
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline_data

CLIENT_ENV = ("LLMGW_TLS_CA", "LLMGW_TLS_CERT", "LLMGW_TLS_KEY", "LLMGW_TOKEN", "LLMGW_DATA")
NO_DATA = "/nonexistent/llmgw-data"
"""$LLMGW_DATA for runs that must not find a local `llmgw up`'s certificates."""

MODEL = {
    "name": "llama-8b",
    "context_length": 8192,
    "shape": inline_data(LLAMA_31_8B),
    "profiles": [
        {
            "name": "gpu",
            "engine": "vllm",
            "args": ["--max-model-len", "8192"],
            "gpu_class": "H100-80GB",
            "gpus_per_node": 1,
        }
    ],
}


def client_env(**extra: str) -> dict[str, str]:
    """The environment without a person's client settings, $LLMGW_DATA pointing nowhere,
    plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return env | {"LLMGW_DATA": NO_DATA} | extra


async def llmgw(port: int, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `llmgw plan --planner 127.0.0.1:PORT ARGS…`; its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.cli.main",
        "plan",
        "--planner",
        f"127.0.0.1:{port}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else client_env(),
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_context_prints_the_change_and_json_for_scripts(tmp_path: Path) -> None:
    """`plan context` prints args before -> after and memory for people, and parses as JSON."""
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL))
    async with running_planner() as (server, _stub, _ch):
        code, out, _ = await llmgw(
            server.port, "context", str(spec), "32768", "--node", "8xH100-80GB:79.6GiB"
        )
        jcode, jout, _ = await llmgw(
            server.port, "--json", "context", str(spec), "32768", "--node", "8xH100-80GB"
        )
    assert code == 0
    assert "context 8192 -> 32768 tokens" in out
    assert "--max-model-len 8192" in out and "--max-model-len 32768" in out
    assert "GiB a card of 1" in out
    assert jcode == 0
    answer = json.loads(jout)
    assert answer["change"]["after"] == "32768"
    assert answer["profiles"][0]["args"] == ["--max-model-len", "32768"]
    assert answer["change"]["max_output"] and camel_keys(answer) == []


async def test_sequences_reach_the_planner_and_the_answer_says_whether_the_batch_fits(
    tmp_path: Path,
) -> None:
    """`--sequences N` on `plan context` and `plan gpus` is written to vLLM's --max-num-seqs
    and the answer says whether N requests of the context fit, for people and in JSON."""
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL))
    node = ("--node", "8xH100-80GB")
    async with running_planner() as (server, _stub, _ch):
        code, out, _ = await llmgw(
            server.port, "context", str(spec), "8192", "--sequences", "32", *node
        )
        jcode, jout, _ = await llmgw(
            server.port, "--json", "context", str(spec), "131072", "--sequences", "64", *node
        )
        gcode, gout, _ = await llmgw(
            server.port, "--json", "gpus", str(spec), "2", "--sequences", "32", *node
        )
    assert code == 0 and "batch of 32 x 8192 tokens on gpu (vllm, --max-num-seqs): fits" in out
    assert jcode == 0
    (batch,) = json.loads(jout)["batches"]
    assert batch["sequences"] == 64 and batch["flag"] == "--max-num-seqs"
    assert batch.get("fits", False) is False and 0 < int(batch["contexts_held"]) < 64
    assert gcode == 0
    (batch,) = json.loads(gout)["batches"]
    assert batch["sequences"] == 32 and batch["fits"] is True


@pytest.mark.parametrize("flag", ["--sequences", "--slots"])
@pytest.mark.parametrize("value", ["99999999999", "-1", "many"])
async def test_a_count_out_of_range_is_refused_before_asking(flag: str, value: str) -> None:
    """A count the request cannot carry is a usage error (64) naming the flag, no traceback."""
    code, _, err = await llmgw(1, "context", "hf://a/b", "4096", flag, value)
    assert code == 64 and flag in err and "Traceback" not in err


async def test_refusal_exits_2_with_reason_and_numbers(tmp_path: Path) -> None:
    """A refused plan exits 2 and prints the reason and its metadata."""
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL))
    async with running_planner() as (server, _stub, _ch):
        code, _, err = await llmgw(server.port, "gpus", str(spec), "3", "--node", "8xH100-80GB")
        jcode, jout, _ = await llmgw(
            server.port, "--json", "context", str(spec), "100", "--node", "8xH100-80GB"
        )
    assert code == 2
    assert "HEADS_NOT_DIVISIBLE" in err and "valid_counts: 1,2,4,8" in err
    assert jcode == 2
    assert json.loads(jout)["error"]["reason"] == "CONTEXT_TOO_SHORT"


async def test_unreachable_planner_exits_3_and_bad_usage_64(tmp_path: Path) -> None:
    """No planner at the address exits 3; an unreadable model file exits 64."""
    code, _, err = await llmgw(1, "describe", "hf://a/b")
    assert code == 3 and "did not answer" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    async with running_planner() as (server, _stub, _ch):
        code, _, err = await llmgw(server.port, "context", str(bad), "4096")
    assert code == 64 and "bad.yaml" in err


@pytest.fixture
def pki(tmp_path: Path) -> certs.LocalTLS:
    """The DATA/tls a `llmgw up --data TMP/data` writes."""
    return certs.make_local_tls(tmp_path / "data" / "tls")


def mutual(pki: certs.LocalTLS) -> ServerTLS:
    """The planner's pair, a client certificate of the local CA required."""
    cert, key = pki.servers["planner"]
    return ServerTLS(cert=cert, key=key, ca=pki.ca_cert)


def admin(pki: certs.LocalTLS) -> ClientTLS:
    """The admin pair of the local CA."""
    cert, key = pki.clients["admin"]
    return ClientTLS(ca=pki.ca_cert, cert=cert, key=key)


async def test_over_mutual_tls_by_flags_environment_or_beside_llmgw_up(
    tmp_path: Path, pki: certs.LocalTLS
) -> None:
    """Against a planner that requires a client certificate, `plan` answers with the pair given
    by flags, by LLMGW_TLS_*, or found under $LLMGW_DATA/tls; with none it exits 3 saying the
    planner may require TLS, with no traceback."""
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL))
    ask = ("context", str(spec), "32768", "--node", "8xH100-80GB")
    ca, (cert, key) = str(pki.ca_cert), map(str, pki.clients["admin"])
    async with running_planner(tls=mutual(pki), client_tls=admin(pki)) as (server, _stub, _ch):
        by_flags = await llmgw(
            server.port, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, *ask
        )
        by_env = await llmgw(
            server.port,
            *ask,
            env=client_env(LLMGW_TLS_CA=ca, LLMGW_TLS_CERT=cert, LLMGW_TLS_KEY=key),
        )
        beside_up = await llmgw(
            server.port, *ask, env=client_env(LLMGW_DATA=str(tmp_path / "data"))
        )
        plaintext = await llmgw(server.port, *ask)
    for code, out, err in (by_flags, by_env, beside_up):
        assert code == 0, err
        assert "context 8192 -> 32768 tokens" in out
    code, _, err = plaintext
    assert code == 3
    assert "may require TLS" in err and "--tls-ca" in err
    assert "Traceback" not in err and "ssl_transport_security" not in err


async def test_a_planner_of_another_ca_is_a_clear_tls_failure(
    tmp_path: Path, pki: certs.LocalTLS
) -> None:
    """Trusting another CA than the planner's exits 3 with the handshake's reason and what
    to check, naming where the files came from."""
    other = certs.make_local_tls(tmp_path / "other" / "tls")
    async with running_planner(tls=mutual(pki), client_tls=admin(pki)) as (server, _stub, _ch):
        code, _, err = await llmgw(
            server.port,
            "describe",
            "hf://a/b",
            env=client_env(LLMGW_DATA=str(tmp_path / "other")),
        )
    assert other.ca_cert.is_file()
    assert code == 3
    assert "TLS handshake failed" in err and "CERTIFICATE_VERIFY_FAILED" in err
    assert str(tmp_path / "other" / "tls") in err
    assert "Traceback" not in err and "ssl_transport_security" not in err


async def test_a_plan_whose_model_could_not_be_read_exits_6_not_checked(tmp_path: Path) -> None:
    """`plan gpus` of a source the planner cannot read prints the change but exits 6 with the
    reason on stderr, and its JSON says verdict NOT_CHECKED: a script does not take TP 3 of an
    unread model for an answer; a model it could read exits 0 with a checked verdict."""
    unread = "http://127.0.0.1:1/unreachable.gguf"
    spec = tmp_path / "model.yaml"
    spec.write_text(yaml.safe_dump(MODEL))
    async with running_planner() as (server, _stub, _ch):
        code, out, err = await llmgw(
            server.port, "gpus", unread, "3", "--engine", "vllm", "--node", "8xH100-80GB"
        )
        jcode, jout, _ = await llmgw(
            server.port, "--json", "gpus", unread, "3", "--engine", "vllm", "--node", "8xH100-80GB"
        )
        ok, _, _ = await llmgw(server.port, "gpus", str(spec), "2", "--node", "8xH100-80GB")
    assert (code, jcode, ok) == (6, 6, 0)
    assert "not checked:" in err and "could not be read" in err
    assert out  # the change is still shown
    change = json.loads(jout)["change"]
    assert change["verdict"] == "FIT_VERDICT_NOT_CHECKED" and change["verdict_note"]
