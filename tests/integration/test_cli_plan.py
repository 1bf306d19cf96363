"""`llmgw plan` as operators run it: a real planner, the real command in a child process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import yaml

from tests.support.planner import running_planner

MODEL = {
    "name": "llama-8b",
    "context_length": 8192,
    "shape": {
        "architecture": "llama",
        "layers": 32,
        "attention_heads": 32,
        "kv_heads": 8,
        "head_dim_k": 128,
        "head_dim_v": 128,
        "trained_context": 131072,
        "weights_bytes": 16060522496,
    },
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


async def llmgw(port: int, *args: str) -> tuple[int, str, str]:
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
        env={**os.environ},
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
