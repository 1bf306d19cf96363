"""pytest fixtures for the Hugging Face-shaped server (llmgw/testing/hub.py).

`hf_server_factory(repos, gated=...)` starts a server and points the process at it;
`hf_server` is one with tests/support/hf_repos.py's `default_repos()` and its gated repo
`GATED`. Pointing at it means: `HF_ENDPOINT` is the server, `HF_HOME` a fresh temporary folder
(so the cache starts empty and no real token file is read), `HF_TOKEN` and `HF_HUB_OFFLINE`
unset. huggingface_hub reads those once,
at import, into `huggingface_hub.constants`; the fixture patches those constants too, so code
that leans on huggingface_hub's defaults sees the same settings.

Use them from a test module with `pytest_plugins = ("tests.support.hf_fixtures",)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from huggingface_hub import constants

from llmgw.testing.content import Content
from llmgw.testing.hub import HFServer
from tests.support.hf_repos import GATED, GATED_TOKEN, default_repos


def point_hub_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path) -> None:
    """Make this process use the Hub at `endpoint` with an empty cache under `home`."""
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json"))


@pytest.fixture
def hf_server_factory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[..., HFServer]]:
    """Start an HFServer for `repos` (and `gated={repo: token}`), pointing the process at it
    with a fresh HF_HOME; every server started is stopped at the end of the test."""
    servers: list[HFServer] = []

    def start(
        repos: Mapping[str, Mapping[str, Content]] | None = None,
        *,
        gated: Mapping[str, str] | None = None,
    ) -> HFServer:
        server = HFServer(default_repos() if repos is None else repos, gated=gated).start()
        servers.append(server)
        point_hub_at(monkeypatch, server.url, tmp_path / f"hf-home-{len(servers)}")
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def hf_server(hf_server_factory: Callable[..., HFServer]) -> HFServer:
    """An HFServer with `default_repos()`, `GATED` readable with `GATED_TOKEN`, in use."""
    return hf_server_factory(default_repos(), gated={GATED: GATED_TOKEN})
