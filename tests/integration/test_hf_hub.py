"""fetch_hf_model against the Hugging Face-shaped server: config and weights through the
endpoint, the local cache and offline mode, tokens for gated repos, and the errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from huggingface_hub.utils import _http as hf_http

from llmgw.testing.hub import HFServer
from planner_svc.domain.errors import InvalidShape, SourceUnreachable
from planner_svc.sources.hf_hub import fetch_hf_model, weight_bytes_from_files
from planner_svc.sources.policy import hub_mirrors
from tests.support.hf_repos import (
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V2_LITE_WEIGHTS_BYTES,
    FALCON_MAMBA,
    FIXTURES,
    GATED,
    GATED_TOKEN,
    HUGE_CONFIG,
    LLAMA_1B,
    LLAMA_1B_WEIGHTS_BYTES,
    NO_CONFIG,
    NOT_AN_OBJECT,
    NOT_JSON,
    QWEN_7B,
    QWEN_7B_WEIGHTS_BYTES,
    default_repos,
)

pytest_plugins = ("tests.support.hf_fixtures",)


def fixture_config(name: str) -> dict[str, object]:
    """A fixture config.json, parsed, to compare with what came through the server."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("repo", "fixture", "weights"),
    [
        # model.safetensors: its header's tensors, 2 x 1,235,814,400 B.
        (LLAMA_1B, "meta-llama__Llama-3.2-1B-Instruct", LLAMA_1B_WEIGHTS_BYTES),
        # Sharded: the index, then each shard's header; INDEX.md's total_size.
        (QWEN_7B, "Qwen__Qwen2.5-7B-Instruct", QWEN_7B_WEIGHTS_BYTES),
        # No safetensors: the repo's .bin file sizes from model info.
        (DEEPSEEK_V2_LITE, "deepseek-ai__DeepSeek-V2-Lite", DEEPSEEK_V2_LITE_WEIGHTS_BYTES),
        # No weight files at all: 0, no error.
        (FALCON_MAMBA, "tiiuae__falcon-mamba-7b", 0),
    ],
)
async def test_config_and_weights_come_through_the_endpoint(
    hf_server: HFServer, repo: str, fixture: str, weights: int
) -> None:
    """config.json arrives as the repo holds it, and the weights' bytes are read from the
    safetensors headers, else the file list, else 0."""
    config, weight_bytes = await fetch_hf_model(repo, None)
    assert config == fixture_config(fixture)
    assert weight_bytes == weights
    assert hf_server.count(method="GET", path=f"/{repo}/resolve/main/config.json") == 1


async def test_safetensors_weights_are_read_by_header_ranges_only(hf_server: HFServer) -> None:
    """Sizing the weights fetches only the first 100 kB of each shard, never the tensors."""
    await fetch_hf_model(QWEN_7B, None)
    shard_gets = [r for r in hf_server.requests if r.listener == "cdn"]
    assert len(shard_gets) == 2
    assert all(r.range_header == "bytes=0-100000" for r in shard_gets)


async def test_catalog_files_size_the_weights_without_asking_the_hub(hf_server: HFServer) -> None:
    """With the catalog's file list, the weights are its sizes and no weight file is requested."""
    files = [
        ("config.json", 877),
        ("model-00001-of-00002.safetensors", 3_000),
        ("model-00002-of-00002.safetensors", 2_000),
        ("consolidated.safetensors", 5_000),
    ]
    _, weights = await fetch_hf_model(LLAMA_1B, None, files=files)
    assert weights == 5_000
    assert hf_server.count(path="safetensors") == 0
    assert hf_server.count(listener="cdn") == 0


async def test_a_pinned_revision_is_fetched_and_then_served_from_disk(hf_server: HFServer) -> None:
    """A commit-pinned fetch works, and repeating it reads the local cache without any request."""
    commit = hf_server.commit(LLAMA_1B)
    config, _ = await fetch_hf_model(LLAMA_1B, commit)
    hf_server.reset_counts()
    again, _ = await fetch_hf_model(LLAMA_1B, commit, files=[("model.safetensors", 1)])
    assert again == config
    assert hf_server.count(path=LLAMA_1B) == 0


async def test_a_cached_config_is_not_downloaded_again(hf_server: HFServer) -> None:
    """A second fetch checks the Hub (HEAD) but takes config.json from the local cache."""
    await fetch_hf_model(LLAMA_1B, None)
    await fetch_hf_model(LLAMA_1B, None)
    assert hf_server.count(method="GET", path=f"/{LLAMA_1B}/resolve/main/config.json") == 1


async def test_offline_mode_serves_from_the_cache_after_a_first_fetch(
    hf_server: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HF_HUB_OFFLINE set, a repo fetched before comes from the cache and the Hub is not
    asked anything (weights from the catalog, else unknown)."""
    online, _ = await fetch_hf_model(LLAMA_1B, None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf_server.reset_counts()
    offline, weights = await fetch_hf_model(LLAMA_1B, None)
    assert offline == online
    assert weights == 0
    _, from_files = await fetch_hf_model(LLAMA_1B, None, files=[("model.safetensors", 42)])
    assert from_files == 42
    assert hf_server.requests == []


async def test_offline_mode_without_a_cached_copy_is_unreachable(
    hf_server: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline, a repo never fetched is SourceUnreachable saying HF_HUB_OFFLINE is set."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceUnreachable) as caught:
        await fetch_hf_model(QWEN_7B, None)
    assert "HF_HUB_OFFLINE" in caught.value.message
    assert hf_server.count(path=QWEN_7B) == 0


async def test_gated_repo_needs_hf_token(
    hf_server: HFServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gated repo is SourceUnreachable naming HF_TOKEN, and readable once HF_TOKEN is set."""
    with pytest.raises(SourceUnreachable) as caught:
        await fetch_hf_model(GATED, None)
    assert "gated" in caught.value.message and "HF_TOKEN" in caught.value.message
    monkeypatch.setenv("HF_TOKEN", GATED_TOKEN)
    config, _ = await fetch_hf_model(GATED, None)
    assert config == fixture_config("meta-llama__Llama-3.1-8B-Instruct")


@pytest.mark.parametrize(
    ("repo", "revision", "words"),
    [
        ("nobody/no-such-model", None, "not found"),
        (NO_CONFIG, None, "no config.json"),
        (LLAMA_1B, "no-such-branch", "revision"),
    ],
)
async def test_missing_repos_files_and_revisions_are_unreachable(
    hf_server: HFServer, repo: str, revision: str | None, words: str
) -> None:
    """A missing repo, config.json or revision raises SourceUnreachable saying which."""
    with pytest.raises(SourceUnreachable) as caught:
        await fetch_hf_model(repo, revision)
    assert words in caught.value.message
    assert caught.value.source.startswith(f"hf://{repo}")


async def test_an_unreachable_hub_is_unreachable(
    hf_server_factory: Callable[..., HFServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the Hub gone (connection refused) and nothing cached, the fetch is SourceUnreachable
    (after huggingface_hub's own retries)."""
    # huggingface_hub retries a refused connection with 1-8 s backoff (~23 s in all,
    # utils/_http.py http_backoff); the test keeps the retries and skips the waits.
    waits: list[float] = []
    monkeypatch.setattr(hf_http, "time", SimpleNamespace(sleep=waits.append))
    server = hf_server_factory()
    server.stop()
    with pytest.raises(SourceUnreachable) as caught:
        await fetch_hf_model(FALCON_MAMBA, None)
    assert "could not be reached" in caught.value.message
    assert waits


@pytest.mark.parametrize(
    ("repo", "words"),
    [
        (NOT_JSON, "not valid JSON"),
        (NOT_AN_OBJECT, "not an object"),
        (HUGE_CONFIG, "bytes"),
    ],
)
async def test_malformed_config_json_is_invalid_shape(
    hf_server: HFServer, repo: str, words: str
) -> None:
    """config.json that is not JSON, not an object, or too large raises InvalidShape."""
    with pytest.raises(InvalidShape) as caught:
        await fetch_hf_model(repo, None)
    assert words in caught.value.message


async def test_an_oversized_config_is_refused_before_download(hf_server: HFServer) -> None:
    """A config.json over the bound is refused from its announced size, never downloaded."""
    with pytest.raises(InvalidShape):
        await fetch_hf_model(HUGE_CONFIG, None)
    assert hf_server.count(method="GET", path=HUGE_CONFIG) == 0


async def test_a_malformed_repo_id_is_invalid_shape(hf_server: HFServer) -> None:
    """A repo id the Hub could not have is InvalidShape, with no request made."""
    with pytest.raises(InvalidShape):
        await fetch_hf_model("org/na..me", None)
    assert hf_server.count(path="na..me") == 0


@pytest.mark.parametrize(
    ("files", "weights"),
    [
        ([], 0),
        ([("config.json", 700), ("README.md", 10)], 0),
        ([("model.safetensors", 10), ("pytorch_model.bin", 12)], 10),
        ([("pytorch_model-00001-of-00002.bin", 5), ("pytorch_model-00002-of-00002.bin", 6)], 11),
        ([("model.pt", 3), ("x.gguf", 100)], 3),
        ([("model-Q4_K_M.gguf", 100)], 100),
        ([("consolidated.safetensors", 9)], 9),
        ([("consolidated.safetensors", 9), ("model-00001-of-00001.safetensors", 8)], 8),
        ([("original/consolidated.00.pth", 50), ("model.safetensors", 40)], 40),
        ([("original/consolidated.00.pth", 50)], 50),
        ([("MODEL.SAFETENSORS", 7)], 7),
    ],
)
def test_weight_bytes_from_files_counts_one_format(
    files: list[tuple[str, int]], weights: int
) -> None:
    """The file list's weights are one format's sizes (safetensors, else PyTorch, else GGUF),
    top-level files first, so the same weights shipped twice count once."""
    assert weight_bytes_from_files(files) == weights


@pytest.mark.parametrize(
    "files",
    [[("model.safetensors", -1)], [("model.safetensors", "10")], [(3, 10)], [("x.bin", True)]],
)
def test_weight_bytes_from_bad_files_are_refused(files: list[tuple[object, object]]) -> None:
    """A file list entry with a negative or non-integer size, or a non-text path, raises
    InvalidShape."""
    with pytest.raises(InvalidShape):
        weight_bytes_from_files(files)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "revision",
    ["main/../../../../tmp/x", "..", "-x", "main//x", "%2e%2e", "a" * 256, "refs/.hidden"],
)
async def test_a_revision_that_could_climb_is_refused_before_the_hub_is_asked(
    hf_server: HFServer, revision: str
) -> None:
    """A revision that is not a plain branch, tag or commit is InvalidShape at the Hub edge
    itself (refs/REVISION is a path in the cache), with no request made."""
    with pytest.raises(InvalidShape, match="refused"):
        await fetch_hf_model(LLAMA_1B, revision)
    assert hf_server.count(path=LLAMA_1B) == 0


async def test_a_refs_revision_is_still_a_revision(hf_server: HFServer) -> None:
    """A nested ref such as refs/pr/1 passes the rule and reaches the Hub (which knows none
    here, so: revision not found)."""
    with pytest.raises(SourceUnreachable, match="revision"):
        await fetch_hf_model(LLAMA_1B, "refs/pr/1")
    assert hf_server.count(path=LLAMA_1B) >= 1


async def test_a_download_outside_the_cache_is_refused(
    hf_server: HFServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Should huggingface_hub ever place a file outside the cache (a hostile commit id from
    the endpoint), the fetch is SourceUnreachable and the file is not read."""
    from planner_svc.sources import hf_hub

    outside = tmp_path / "outside" / "config.json"
    outside.parent.mkdir()
    outside.write_text("{}")
    real: Any = getattr(hf_hub, "hf_hub_download")  # noqa: B009 - patched below

    def escaping(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)
        if kwargs.get("dry_run"):
            return answer
        return str(outside)

    monkeypatch.setattr(hf_hub, "hf_hub_download", escaping)
    with pytest.raises(SourceUnreachable, match="outside the cache"):
        await fetch_hf_model(FALCON_MAMBA, None)


async def test_a_mirror_serves_its_organisation_and_the_hub_the_rest(
    hf_server_factory: Callable[..., HFServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With LLMGW_HF_MIRRORS naming an organisation (as `llmgw up` names the demo's), that
    organisation's repos come from its mirror and every other repo from the Hub (HF_ENDPOINT);
    each server holds only its own repos, so a fetch routed wrong fails. A repo missing from
    the mirror is said to be missing there."""
    org = LLAMA_1B.split("/", 1)[0]
    repos = default_repos()
    hub = hf_server_factory({k: v for k, v in repos.items() if not k.startswith(f"{org}/")})
    mirror = HFServer({k: v for k, v in repos.items() if k.startswith(f"{org}/")}).start()
    try:
        monkeypatch.setenv("LLMGW_HF_MIRRORS", f"other-org=http://127.0.0.1:1,{org}={mirror.url}")
        config, weights = await fetch_hf_model(LLAMA_1B, None)
        assert config == fixture_config("meta-llama__Llama-3.2-1B-Instruct")
        assert weights == LLAMA_1B_WEIGHTS_BYTES
        assert mirror.count(method="GET", path=f"/{LLAMA_1B}/resolve/main/config.json") == 1
        config, _ = await fetch_hf_model(QWEN_7B, None)
        assert config == fixture_config("Qwen__Qwen2.5-7B-Instruct")
        assert hub.count(method="GET", path=f"/{QWEN_7B}/resolve/main/config.json") == 1
        assert mirror.count(method="GET", path=f"/{QWEN_7B}/resolve/main/config.json") == 0
        with pytest.raises(SourceUnreachable) as caught:
            await fetch_hf_model(f"{org}/not-there", None)
        assert f"not found on {mirror.url}" in caught.value.message
    finally:
        mirror.stop()


@pytest.mark.parametrize("text", ["nourl", "org=ftp://x", "=http://x", "a b=http://x"])
def test_malformed_mirrors_are_refused(text: str) -> None:
    """A mirror entry that is not ORG=http(s)://HOST is refused (the planner will not start)."""
    with pytest.raises(ValueError, match="LLMGW_HF_MIRRORS"):
        hub_mirrors(text)
