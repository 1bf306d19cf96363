"""The agent's model cache against the Hub stand-in (real HTTP servers, a hub and its CDN on
127.0.0.1): a GGUF fetched once at the commit its URL pins, checked against what the Hub
says, bounded in size; and an agent that hands llama.cpp the cached file, never the URL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_svc.agent.fetch import FetchError, ModelCache
from llmgw.agent.v1 import agent_pb2
from llmgw.testing.content import SparseFile
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet
from llmgw.testing.hub import HFServer
from tests.integration.test_agent_process import HEALTHY, agent_process, stop_agent

REPO = "org/tiny-GGUF"
# A GGUF-shaped file: the magic and version 3, then bytes; the agent checks the magic, the
# length and the hash, not what the header says (the planner read that).
GGUF = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 64
NOT_GGUF = b"<html>not found</html>" + bytes(4096)


@pytest.fixture
def hub() -> Iterator[HFServer]:
    """A Hub holding a GGUF, a file that is no GGUF, and a 10 GB sparse GGUF."""
    server = HFServer(
        {
            REPO: {
                "tiny-Q8_0.gguf": GGUF,
                "fake.gguf": NOT_GGUF,
                "big.gguf": SparseFile(GGUF[:64], 10 << 30),
            }
        }
    ).start()
    yield server
    server.stop()


def resolve(hub: HFServer, path: str, revision: str = "") -> str:
    """The resolve URL of a file of REPO at `revision` (its commit by default)."""
    return f"{hub.url}/{REPO}/resolve/{revision or hub.commit(REPO)}/{path}"


async def test_a_gguf_is_fetched_once_checked_and_cached(hub: HFServer, tmp_path: Path) -> None:
    """The first fetch follows the Hub's redirect to its CDN and keeps the file with its
    commit and the SHA-256 the Hub named; a second fetch (another cache on the same folder,
    as a restarted agent) reads nothing from the network."""
    url = resolve(hub, "tiny-Q8_0.gguf")
    seen: list[tuple[int, int]] = []
    cache = ModelCache(tmp_path / "models")
    fetched = await cache.fetch(url, lambda got, size: seen.append((got, size)))
    await cache.aclose()
    assert fetched.path.read_bytes() == GGUF and fetched.path.name == "tiny-Q8_0.gguf"
    assert fetched.sha256 == hashlib.sha256(GGUF).hexdigest()
    assert fetched.commit == hub.commit(REPO)
    assert seen[-1] == (len(GGUF), len(GGUF))
    assert hub.count(listener="cdn", path="/blobs/") == 1
    hub.reset_counts()
    again = ModelCache(tmp_path / "models")
    assert (await again.fetch(url)).path == fetched.path
    await again.aclose()
    assert hub.count() == 0
    meta = json.loads((fetched.path.parent / "fetched.json").read_text())
    assert meta["commit"] == hub.commit(REPO) and meta["bytes"] == len(GGUF)


@pytest.mark.parametrize(
    ("path", "revision", "max_bytes", "says"),
    [
        ("big.gguf", "", 1 << 30, "more than the 1073741824 this agent fetches"),
        ("fake.gguf", "", 1 << 30, "no GGUF"),
        ("tiny-00001-of-00002.gguf", "", 1 << 30, "split GGUF"),
        ("tiny-Q8_0.gguf", "f" * 40, 1 << 30, "HTTP 404"),
        ("missing.gguf", "", 1 << 30, "HTTP 404"),
    ],
)
async def test_a_file_that_fails_a_check_is_refused_and_not_kept(
    hub: HFServer, tmp_path: Path, path: str, revision: str, max_bytes: int, says: str
) -> None:
    """Too large for the bound (refused on the length the CDN announced, before its body is
    read), no GGUF, split, at a commit the Hub does not have, or missing: FetchError saying
    which, and nothing left in the cache."""
    cache = ModelCache(tmp_path / "models", max_bytes=max_bytes)
    with pytest.raises(FetchError) as caught:
        await cache.fetch(resolve(hub, path, revision))
    await cache.aclose()
    assert says in str(caught.value)
    left = [p for p in (tmp_path / "models").rglob("*") if p.is_file()]
    assert left == []


CONFIG = """\
health_interval_s: 0.1
health_timeout_s: 1
restart: {{base_s: 0.2, factor: 2, cap_s: 1, jitter: 0, max_crashes: 1}}
engines:
  llamacpp:
    module: fleet_svc.standin
    family: llamacpp
    args: ["--host", "{{host}}", "--port", "{{port}}", "{{source_args}}", "--alias", "{{model}}",
           "{{args}}"]
    env: {{LLMGW_STANDIN_ARGV_DIR: "{argv}"}}
    start_timeout_s: 30
"""


async def test_llamacpp_is_given_the_fetched_file_not_the_url(
    hub: HFServer, tmp_path: Path
) -> None:
    """A llama.cpp replica of a GGUF URL starts with `-m` and the file the agent fetched into
    its state folder (never `-mu URL`), and turns HEALTHY serving its alias."""
    config = tmp_path / "agent.yaml"
    argv_dir = tmp_path / "argv"
    config.write_text(CONFIG.format(argv=argv_dir))
    url = resolve(hub, "tiny-Q8_0.gguf")
    spec = agent_pb2.ReplicaSpec(
        replica_id="r-gguf",
        revision=1,
        model="tiny",
        profile="cpu",
        engine="llamacpp",
        args=["--load-s", "0.2", "-c", "4096"],
        source=url,
    )
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", config=config) as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        fleet.desire(spec)
        await assert_eventually(
            lambda: HEALTHY in fleet.phases_of("r-gguf"), timeout_s=30, what="HEALTHY"
        )
        messages = [u.message for u in fleet.updates_of("r-gguf")]
        await stop_agent(proc)
    argv = json.loads((argv_dir / "r-gguf.json").read_text())
    local = Path(argv[argv.index("-m") + 1])
    assert "-mu" not in argv and url not in argv
    assert local.is_relative_to(tmp_path / "state" / "models") and local.read_bytes() == GGUF
    assert any(m.startswith("fetching tiny-Q8_0.gguf") for m in messages)
