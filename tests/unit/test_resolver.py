"""ShapeResolver: source forms, the expiring LRU cache, one fetch per source under concurrency,
failures not cached; fakes for the readers, and one run through the HF-shaped server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from llmgw.testing.hub import HFServer
from planner_svc.domain.errors import InvalidShape, SourceUnreachable
from planner_svc.sources.resolver import ShapeResolver
from tests.support.hf_repos import FIXTURES, LLAMA_1B, LLAMA_1B_WEIGHTS_BYTES

pytest_plugins = ("tests.support.hf_fixtures",)

LLAMA_CONFIG = json.loads((FIXTURES / "meta-llama__Llama-3.2-1B-Instruct.json").read_text())
QWEN_CONFIG = json.loads((FIXTURES / "Qwen__Qwen3-8B.json").read_text())

# A small llama GGUF header's metadata (the keys llama.cpp reads for Llama-3.2-1B).
GGUF_METADATA: dict[str, object] = {
    "general.architecture": "llama",
    "llama.block_count": 16,
    "llama.context_length": 131072,
    "llama.embedding_length": 2048,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.attention.key_length": 64,
    "llama.attention.value_length": 64,
}


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeHub:
    """An hf_fetcher: configs by repo, calls recorded, optionally held until released, and
    scripted failures (raised in order, before any success)."""

    configs: Mapping[str, dict[str, object]]
    weights: int = 123
    failures: list[BaseException] = field(default_factory=list)
    hold: asyncio.Event | None = None
    calls: list[tuple[str, str | None, tuple[tuple[str, int], ...]]] = field(default_factory=list)

    async def __call__(
        self, repo: str, revision: str | None, *, files: Sequence[tuple[str, int]] = ()
    ) -> tuple[dict[str, object], int]:
        self.calls.append((repo, revision, tuple(files)))
        if self.hold is not None:
            await self.hold.wait()
        if self.failures:
            raise self.failures.pop(0)
        if repo not in self.configs:
            raise SourceUnreachable(f"hf://{repo} was not found.")
        return dict(self.configs[repo]), self.weights


@dataclass(frozen=True)
class FakeHeader:
    """What the resolver reads of a GGUF header."""

    metadata: Mapping[str, object]
    file_bytes: int
    tensor_bytes: int


@dataclass
class FakeGGUF:
    """A gguf_reader returning one header for every source, recording the sources."""

    file_bytes: int = 0
    tensor_bytes: int = 0
    sources: list[str] = field(default_factory=list)

    async def __call__(self, source: str) -> FakeHeader:
        self.sources.append(source)
        return FakeHeader(GGUF_METADATA, self.file_bytes, self.tensor_bytes)


def resolver_with(
    hub: FakeHub | None = None,
    gguf: FakeGGUF | None = None,
    *,
    clock: FakeClock | None = None,
    ttl_s: float = 600,
    max_entries: int = 256,
) -> ShapeResolver:
    """A resolver over fakes."""
    return ShapeResolver(
        ttl_s=ttl_s,
        max_entries=max_entries,
        clock=clock or FakeClock(),
        gguf_reader=gguf or FakeGGUF(),
        hf_fetcher=hub or FakeHub({}),
    )


REPOS = {"meta-llama/Llama-3.2-1B-Instruct": LLAMA_CONFIG, "Qwen/Qwen3-8B": QWEN_CONFIG}
LLAMA = "hf://meta-llama/Llama-3.2-1B-Instruct"
QWEN = "hf://Qwen/Qwen3-8B"


async def test_second_resolve_is_served_from_the_cache() -> None:
    """A source resolved once is answered from the cache the next time, without a fetch."""
    hub = FakeHub(REPOS)
    resolver = resolver_with(hub)
    first = await resolver.resolve(LLAMA)
    second = await resolver.resolve(LLAMA)
    assert second is first
    assert first.kv_bytes_per_token() == 32_768
    assert first.weights_bytes == 123
    assert (resolver.stats.hits, resolver.stats.misses, resolver.stats.fetches) == (1, 1, 1)
    assert len(hub.calls) == 1


async def test_entries_expire_after_ttl_by_the_injected_clock() -> None:
    """A shape is served until ttl_s has passed on the clock, then fetched again."""
    clock = FakeClock()
    hub = FakeHub(REPOS)
    resolver = resolver_with(hub, clock=clock, ttl_s=60)
    await resolver.resolve(LLAMA)
    clock.now += 59.9
    await resolver.resolve(LLAMA)
    assert len(hub.calls) == 1
    clock.now += 0.1
    await resolver.resolve(LLAMA)
    assert len(hub.calls) == 2
    assert (resolver.stats.hits, resolver.stats.fetches) == (1, 2)


async def test_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    """With room for two, a third source evicts the one used least recently."""
    hub = FakeHub(REPOS)
    gguf = FakeGGUF(file_bytes=1000)
    resolver = resolver_with(hub, gguf, max_entries=2)
    await resolver.resolve(LLAMA)
    await resolver.resolve(QWEN)
    await resolver.resolve(LLAMA)  # LLAMA is now the most recently used
    await resolver.resolve("/models/llama-3.2-1b.gguf")  # evicts QWEN
    assert len(resolver) == 2
    await resolver.resolve(LLAMA)
    assert resolver.stats.fetches == 3
    await resolver.resolve(QWEN)
    assert resolver.stats.fetches == 4
    assert len(resolver) == 2


@pytest.mark.parametrize("callers", [2, 25])
async def test_concurrent_requests_share_one_fetch(callers: int) -> None:
    """N concurrent resolves of one source make one fetch and all get its shape."""
    hub = FakeHub(REPOS, hold=asyncio.Event())
    resolver = resolver_with(hub)
    waiting = [asyncio.create_task(resolver.resolve(LLAMA)) for _ in range(callers)]
    await asyncio.sleep(0)
    assert hub.hold is not None
    hub.hold.set()
    shapes = await asyncio.gather(*waiting)
    assert len(hub.calls) == 1
    assert all(shape is shapes[0] for shape in shapes)
    assert (resolver.stats.misses, resolver.stats.fetches, resolver.stats.hits) == (callers, 1, 0)


async def test_concurrent_requests_for_different_sources_fetch_each_once() -> None:
    """Concurrent resolves of two sources make exactly one fetch per source."""
    hub = FakeHub(REPOS, hold=asyncio.Event())
    resolver = resolver_with(hub)
    waiting = [asyncio.create_task(resolver.resolve(s)) for s in (LLAMA, QWEN) * 5]
    await asyncio.sleep(0)
    assert hub.hold is not None
    hub.hold.set()
    await asyncio.gather(*waiting)
    assert sorted(call[0] for call in hub.calls) == [
        "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.2-1B-Instruct",
    ]


async def test_a_failed_fetch_is_not_cached() -> None:
    """A fetch that fails is tried again on the next request, which can then succeed."""
    hub = FakeHub(REPOS, failures=[SourceUnreachable("hub down")])
    resolver = resolver_with(hub)
    with pytest.raises(SourceUnreachable):
        await resolver.resolve(LLAMA)
    shape = await resolver.resolve(LLAMA)
    assert shape.block_count == 16
    assert (resolver.stats.fetches, resolver.stats.errors) == (2, 1)


async def test_concurrent_callers_all_get_the_one_fetch_error() -> None:
    """Callers waiting on a fetch that fails all receive its error, from a single fetch."""
    hub = FakeHub(REPOS, failures=[SourceUnreachable("hub down")], hold=asyncio.Event())
    resolver = resolver_with(hub)
    waiting = [asyncio.create_task(resolver.resolve(LLAMA)) for _ in range(5)]
    await asyncio.sleep(0)
    assert hub.hold is not None
    hub.hold.set()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(result, SourceUnreachable) for result in results)
    assert len(hub.calls) == 1


async def test_a_caller_giving_up_does_not_cancel_the_shared_fetch() -> None:
    """Cancelling one waiting caller leaves the fetch running for the others."""
    hub = FakeHub(REPOS, hold=asyncio.Event())
    resolver = resolver_with(hub)
    quitter = asyncio.create_task(resolver.resolve(LLAMA))
    stayer = asyncio.create_task(resolver.resolve(LLAMA))
    await asyncio.sleep(0)
    quitter.cancel()
    assert hub.hold is not None
    hub.hold.set()
    assert (await stayer).block_count == 16
    assert quitter.cancelled()
    assert len(hub.calls) == 1


@pytest.mark.parametrize(
    "source",
    [
        "",
        "   ",
        "llama-3.2-1b",
        "meta-llama/Llama-3.2-1B-Instruct",
        "https://example.org/model.safetensors",
        "https:///model.gguf",
        "ftp://example.org/model.gguf",
        "s3://bucket/model.gguf",
        "hf://",
        "hf://meta-llama",
        "hf://meta-llama/Llama/extra",
        "hf://meta-llama/Llama..3",
        "hf://meta-llama/Llama--3",
        "hf://-org/name",
        "hf://org/name@",
        "hf://org/name@bad revision",
        "hf://" + "a" * 97 + "/name",
        42,
        None,
    ],
)
async def test_bad_sources_are_refused_naming_the_accepted_forms(source: object) -> None:
    """A source of no accepted form raises InvalidShape saying which forms are, and fetches
    nothing."""
    hub, gguf = FakeHub(REPOS), FakeGGUF()
    resolver = resolver_with(hub, gguf)
    with pytest.raises(InvalidShape) as caught:
        await resolver.resolve(source)  # type: ignore[arg-type]
    assert "hf://ORG/NAME" in caught.value.message
    assert hub.calls == [] and gguf.sources == []
    assert resolver.stats.fetches == 0


@pytest.mark.parametrize(
    ("source", "repo", "revision"),
    [
        ("hf://meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", None),
        ("hf://meta-llama/Llama-3.2-1B-Instruct@main", "meta-llama/Llama-3.2-1B-Instruct", "main"),
        ("hf://Qwen/Qwen3-8B@refs/pr/12", "Qwen/Qwen3-8B", "refs/pr/12"),
        (" hf://Qwen/Qwen3-8B@v1.0 ", "Qwen/Qwen3-8B", "v1.0"),
    ],
)
async def test_hf_sources_reach_the_hub_fetcher_as_repo_and_revision(
    source: str, repo: str, revision: str | None
) -> None:
    """hf://ORG/NAME[@REVISION] is fetched as (ORG/NAME, REVISION)."""
    hub = FakeHub(REPOS)
    shape = await resolver_with(hub).resolve(source)
    assert hub.calls == [(repo, revision, ())]
    assert shape.format == "hf"


@pytest.mark.parametrize(
    "source",
    [
        "https://huggingface.co/x/y/resolve/main/Llama-3.2-1B-Q4_K_M.gguf?download=true",
        "http://127.0.0.1:8080/models/llama.gguf",
        "/models/llama-3.2-1b.gguf",
        "models/LLAMA.GGUF",
    ],
)
async def test_gguf_urls_and_paths_go_to_the_gguf_reader(source: str) -> None:
    """A GGUF URL or local .gguf path is read by the GGUF reader as given."""
    gguf = FakeGGUF(tensor_bytes=2_000, file_bytes=3_000)
    shape = await resolver_with(gguf=gguf).resolve(source)
    assert gguf.sources == [source]
    assert shape.format == "gguf"
    assert shape.weights_bytes == 2_000


@pytest.mark.parametrize(
    ("file_bytes", "tensor_bytes", "files", "weights"),
    [
        (0, 0, [("llama-Q4_K_M.gguf", 807_694_464)], 807_694_464),
        (0, 0, [], 0),
        (900, 0, [("llama-Q4_K_M.gguf", 5)], 900),
        (900, 800, [("llama-Q4_K_M.gguf", 5)], 800),
    ],
)
async def test_gguf_weights_fall_back_to_the_catalog_files(
    file_bytes: int, tensor_bytes: int, files: list[tuple[str, int]], weights: int
) -> None:
    """A GGUF's weights are its tensors' bytes, else its file size, else the catalog's sizes."""
    gguf = FakeGGUF(file_bytes=file_bytes, tensor_bytes=tensor_bytes)
    shape = await resolver_with(gguf=gguf).resolve("/m/llama.gguf", files)
    assert shape.weights_bytes == weights


async def test_catalog_files_are_passed_to_the_hub_fetcher() -> None:
    """The catalog's file list reaches the hub fetcher (which sizes the weights from it)."""
    hub = FakeHub(REPOS)
    files = [("model.safetensors", 2_471_628_800), ("config.json", 877)]
    await resolver_with(hub).resolve(LLAMA, files)
    assert hub.calls[0][2] == tuple(files)


async def test_bad_file_lists_are_refused() -> None:
    """A catalog file list entry that is not (path, bytes) raises InvalidShape."""
    with pytest.raises(InvalidShape):
        await resolver_with(FakeHub(REPOS)).resolve(LLAMA, [("model.safetensors", "2GB")])  # type: ignore[list-item]


async def test_malformed_hub_config_is_invalid_shape_naming_the_source() -> None:
    """A config the hub returns that is not a model's shape raises InvalidShape naming the
    source, and is not cached."""
    hub = FakeHub({"org/broken": {"model_type": "llama", "num_hidden_layers": 0}})
    resolver = resolver_with(hub)
    for _ in range(2):
        with pytest.raises(InvalidShape) as caught:
            await resolver.resolve("hf://org/broken")
        assert caught.value.message.startswith("hf://org/broken: ")
    assert len(hub.calls) == 2


async def test_invalidate_forgets_a_source() -> None:
    """invalidate(source) makes the next resolve fetch again."""
    hub = FakeHub(REPOS)
    resolver = resolver_with(hub)
    await resolver.resolve(LLAMA)
    resolver.invalidate(LLAMA)
    await resolver.resolve(LLAMA)
    assert len(hub.calls) == 2


async def test_resolves_through_the_hf_server_once(hf_server: HFServer) -> None:
    """Through the real HF-shaped server: the shape and weights come from config.json and the
    safetensors header, and a second resolve asks the server nothing."""
    resolver = ShapeResolver()
    shape = await resolver.resolve(f"hf://{LLAMA_1B}")
    assert shape.kv_bytes_per_token() == 32_768
    assert shape.trained_context == 131_072
    assert shape.weights_bytes == LLAMA_1B_WEIGHTS_BYTES
    asked = hf_server.count(path=LLAMA_1B)
    again = await resolver.resolve(f"hf://{LLAMA_1B}")
    assert again is shape
    assert hf_server.count(path=LLAMA_1B) == asked
