"""The stand-in engine as a real process: loading, answers, argument checks, failures, memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fleet_svc.agent import claims
from fleet_svc.agent.host import free_port

ROOT = Path(__file__).resolve().parents[2]


def standin_env(gpus: str, cards_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment the agent gives a stand-in on these cards."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(ROOT), **extra}
    if cards_dir is not None:
        env[claims.CARDS_DIR_ENV] = str(cards_dir)
    return env


@contextmanager
def standin(
    args: Sequence[str], env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A stand-in process on a free port; yields it and its base URL; killed after."""
    port = free_port("127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet_svc.standin", "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def wait_status(url: str, want: int, timeout_s: float = 10.0) -> list[int]:
    """Poll `url` until it answers `want`; every status seen on the way (0: no answer)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = httpx.get(url, timeout=1.0, trust_env=False).status_code
        except httpx.HTTPError:
            status = 0
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == want:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{url} did not answer {want} within {timeout_s} s: {seen}")


def test_health_fails_while_loading_then_serves_openai_shapes(tmp_path: Path) -> None:
    """/health answers 503 while the model "loads" and 200 after; /v1/models lists the model
    and the completion endpoints answer in the OpenAI shape, the same text for one prompt."""
    args = ["--model", "tiny", "--load-s", "0.8", "--max-model-len", "4096"]
    with standin(args, standin_env("")) as (_, url):
        seen = wait_status(f"{url}/health", 200)
        assert 503 in seen, "health failed while loading"
        models = httpx.get(f"{url}/v1/models", trust_env=False).json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 4096
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}
        first = httpx.post(f"{url}/v1/completions", json=body, trust_env=False).json()
        again = httpx.post(f"{url}/v1/completions", json=body, trust_env=False).json()
        assert first["object"] == "text_completion" and first["model"] == "tiny"
        assert len(first["choices"][0]["text"].split()) == 4
        assert first["choices"][0]["text"] == again["choices"][0]["text"]
        assert first["usage"]["completion_tokens"] == 4
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}]},
            trust_env=False,
        ).json()
        assert chat["object"] == "chat.completion"
        assert chat["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    ("flag", "gpus"),
    [
        (["--tensor-parallel-size", "2"], "0"),
        (["-tp", "1"], "0,1"),
        (["--tp-size=4"], "0,1"),
        (["--tp_size", "2"], ""),
    ],
)
def test_refuses_tensor_parallel_unlike_its_cards(flag: list[str], gpus: str) -> None:
    """A tensor-parallel size (any engine's spelling) other than the visible cards' count
    makes the stand-in exit non-zero with an engine-like error, as vLLM does."""
    with standin([*flag, "--load-s", "0"], standin_env(gpus)) as (proc, _):
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode != 0
    assert "ValueError: tensor parallel size" in out and "does not match" in out


def test_refuses_a_context_that_is_not_a_positive_number() -> None:
    """A context flag with a value that is not a positive whole number is refused."""
    with standin(["--ctx-size", "-5"], standin_env("")) as (proc, _):
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode != 0 and "--ctx-size" in out and "positive integer" in out


def test_fail_env_fails_the_start_with_an_error_line() -> None:
    """LLMGW_STANDIN_FAIL=1 makes it exit non-zero after loading, an error as its last line,
    with the arguments unchanged."""
    env = standin_env("", LLMGW_STANDIN_FAIL="1")
    with standin(["--load-s", "0.2"], env) as (proc, _):
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "failed to load model" in out.strip().splitlines()[-1]


def test_claims_memory_on_its_cards_and_releases_it(tmp_path: Path) -> None:
    """While it runs its cards show the claimed memory; SIGTERM releases it; after SIGKILL
    the claim no longer counts (its process is gone) and is cleaned up."""
    cards = tmp_path / "cards"
    env = standin_env("0,1", cards)
    args = ["--load-s", "0", "--memory-bytes", "1234", "-tp", "2"]
    with standin(args, env) as (proc, url):
        wait_status(f"{url}/health", 200)
        assert [claims.used_bytes(cards, i) for i in (0, 1, 2)] == [1234, 1234, 0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert claims.used_bytes(cards, 0) == 0 and claims.claimed_by(cards, proc.pid) == []
    with standin(args, env) as (proc, url):
        wait_status(f"{url}/health", 200)
        assert claims.used_bytes(cards, 1) == 1234
        proc.kill()
        proc.wait(timeout=10)
        assert claims.claimed_by(cards, proc.pid) == [0, 1], "a killed process cannot clean up"
        assert claims.used_bytes(cards, 1) == 0
        assert claims.claimed_by(cards, proc.pid) == [0], "reading card 1 removed its claim"


def test_fail_after_crashes_a_ready_engine() -> None:
    """--fail-after-s makes a ready engine exit non-zero later, as an engine that dies does."""
    with standin(["--load-s", "0", "--fail-after-s", "0.3"], standin_env("")) as (proc, url):
        wait_status(f"{url}/health", 200)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 1 and "engine core died" in out
