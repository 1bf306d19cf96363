"""The demo's file server: byte ranges as a CDN answers them, and the Hub's answers that
`huggingface_hub` reads (config.json, safetensors headers, model info)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download

from llmgw.demo.files import DemoFileServer
from llmgw.demo.hf_repo import REPO, WEIGHTS_FILE, LlamaConfig, demo_repo
from llmgw.testing.content import content_size
from llmgw.testing.http import UNSATISFIABLE, parse_range


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DemoFileServer]:
    """The file server over a folder with one 1000-byte file and the demo repo."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(bytes(range(250)) * 4)
    (tmp_path / "secret.txt").write_text("outside")
    with DemoFileServer(folder, {REPO: demo_repo()}) as s:
        yield s


@pytest.mark.parametrize(
    ("header", "size", "want"),
    [
        ("bytes=0-99", 1000, (0, 100)),
        ("bytes=900-", 1000, (900, 1000)),
        ("bytes=-10", 1000, (990, 1000)),
        ("bytes=-5000", 1000, (0, 1000)),
        ("bytes=990-5000", 1000, (990, 1000)),
        ("bytes=1000-", 1000, UNSATISFIABLE),
        ("bytes=-0", 1000, UNSATISFIABLE),
        ("bytes=0-", 0, UNSATISFIABLE),
        ("bytes=5-4", 1000, None),
        ("bytes=-", 1000, None),
        ("bytes=0-1,5-6", 1000, None),
        ("items=0-1", 1000, None),
    ],
)
def test_parse_range(header: str, size: int, want: object) -> None:
    """A single byte range is clamped to the file; one past its end is unsatisfiable; a header
    that is not one valid byte range is None (a server may ignore it)."""
    assert parse_range(header, size) == want


def test_file_served_whole_and_by_ranges(server: DemoFileServer) -> None:
    """A file answers 200 whole, 206 with Content-Range for a range, 416 past its end."""
    data = bytes(range(250)) * 4
    url = server.file_url("m.gguf")
    whole = httpx.get(url)
    assert (whole.status_code, whole.content) == (200, data)
    assert whole.headers["accept-ranges"] == "bytes"
    part = httpx.get(url, headers={"Range": "bytes=10-19"})
    assert (part.status_code, part.content) == (206, data[10:20])
    assert part.headers["content-range"] == "bytes 10-19/1000"
    past = httpx.get(url, headers={"Range": "bytes=1000-"})
    assert past.status_code == 416
    assert past.headers["content-range"] == "bytes */1000"
    head = httpx.head(url)
    assert (head.status_code, head.headers["content-length"], head.content) == (200, "1000", b"")


def test_malformed_ranges(server: DemoFileServer) -> None:
    """A Range header that is not one byte range gets the whole file from the folder (as a CDN
    may answer) and 416 from the Hub, as the Hub stand-in has always answered it."""
    data = bytes(range(250)) * 4
    whole = httpx.get(server.file_url("m.gguf"), headers={"Range": "bytes=5-4"})
    assert (whole.status_code, whole.content) == (200, data)
    config = f"{server.url}/{REPO}/resolve/main/config.json"
    size = content_size(demo_repo()["config.json"])
    hub = httpx.get(config, headers={"Range": "bytes=5-4"})
    assert (hub.status_code, hub.headers["content-range"]) == (416, f"bytes */{size}")


def test_files_outside_the_folder_are_not_served(server: DemoFileServer) -> None:
    """A path that climbs out of the folder, or names nothing, is 404."""
    assert httpx.get(f"{server.url}/files/..%2Fsecret.txt").status_code == 404
    assert httpx.get(server.file_url("nope.gguf")).status_code == 404


def test_hub_config_and_safetensors_header(
    server: DemoFileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub downloads the repo's config.json and parses its safetensors header,
    whose tensors add up to the model's parameters."""
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    path = hf_hub_download(
        REPO, "config.json", endpoint=server.url, cache_dir=str(tmp_path / "cache")
    )
    config = json.loads(Path(path).read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (32, 8)
    assert config["max_position_embeddings"] == 32768

    api = HfApi(endpoint=server.url, token=False)
    meta = api.get_safetensors_metadata(REPO)
    tensors = meta.files_metadata[WEIGHTS_FILE].tensors
    c = LlamaConfig()
    assert len(tensors) == 3 + 9 * c.layers
    total = sum(t.data_offsets[1] - t.data_offsets[0] for t in tensors.values())
    params = sum(_prod(t.shape) for t in tensors.values())
    assert total == 2 * params
    assert total > 1_000_000_000

    info = api.model_info(REPO, files_metadata=True)
    sizes = {s.rfilename: s.size for s in info.siblings or ()}
    size = sizes[WEIGHTS_FILE]
    assert size is not None and size > total


def test_hub_errors_are_the_hubs(server: DemoFileServer) -> None:
    """A missing repo, revision and file answer 404 with the Hub's error codes."""
    r = httpx.head(f"{server.url}/nobody/nothing/resolve/main/config.json")
    assert (r.status_code, r.headers["x-error-code"]) == (404, "RepoNotFound")
    r = httpx.head(f"{server.url}/{REPO}/resolve/v9/config.json")
    assert (r.status_code, r.headers["x-error-code"]) == (404, "RevisionNotFound")
    r = httpx.head(f"{server.url}/{REPO}/resolve/main/nope.json")
    assert (r.status_code, r.headers["x-error-code"]) == (404, "EntryNotFound")


def test_sparse_weights_read_by_range(server: DemoFileServer) -> None:
    """The weights file's header bytes are real and its tensor data reads as zeros."""
    url = f"{server.url}/{REPO}/resolve/main/{WEIGHTS_FILE}"
    head = httpx.get(url, headers={"Range": "bytes=0-7"})
    length = int.from_bytes(head.content, "little")
    header = httpx.get(url, headers={"Range": f"bytes=8-{7 + length}"}).content
    assert json.loads(header)["__metadata__"] == {"format": "pt"}
    tail = httpx.get(url, headers={"Range": "bytes=-16"})
    assert (tail.status_code, tail.content) == (206, bytes(16))


def _prod(shape: list[int]) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out
