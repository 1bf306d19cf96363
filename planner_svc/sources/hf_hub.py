"""The Hugging Face Hub edge: a repo's config.json and the bytes of its weights.

Everything goes through `huggingface_hub`, so the Hub's endpoint (`HF_ENDPOINT`), token
(`HF_TOKEN`), local cache (`HF_HOME`, `HF_HUB_CACHE`) and offline mode (`HF_HUB_OFFLINE`) apply.
`huggingface_hub` reads the endpoint, cache and offline switches once, when it is imported; this
module reads them again on every fetch (passing them explicitly) so that a running planner and
its tests see the environment as it is now.

`LLMGW_HF_MIRRORS` (`ORG=URL[,ORG=URL...]`) serves the repos of an organisation from another
endpoint: `llmgw up` gives the planner `llmgw-demo=http://127.0.0.1:50053`, so the demo's ids
come from the demo's file server and every other id from the Hub (HF_ENDPOINT, else
huggingface.co). One cache serves both; the organisation names the repo in it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from huggingface_hub import HfApi, constants, get_token, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from llmgw.sources import revision_problem
from planner_svc.domain.errors import InvalidShape, SourceUnreachable
from planner_svc.sources.budget import DEFAULT_FETCH_LIMITS, FetchBudget, current_budget
from planner_svc.sources.hf_weights import NotOnHub, Unreadable, safetensors_weight_bytes
from planner_svc.sources.policy import ENV_MIRRORS, hub_mirrors

log = structlog.get_logger(__name__)

MAX_CONFIG_BYTES = 4 << 20
"""A config.json larger than this is refused unread (real ones are a few KiB)."""

CONFIG_FILE = "config.json"

_SAFETENSORS = (".safetensors",)
_PYTORCH = (".bin", ".pt", ".pth")
_GGUF = (".gguf",)
_MAX_FILE_BYTES = 1 << 50
# What the Hub's X-Repo-Commit must be before it names a snapshot folder (huggingface_hub's
# REGEX_COMMIT_HASH): anything else could climb out of the cache.
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client errors `huggingface_hub` lets through (httpx2 in 2.x, httpx before)."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            error = importlib.import_module(module).HTTPError
        except (ImportError, AttributeError):
            continue
        if isinstance(error, type) and issubclass(error, BaseException):
            errors.append(error)
    return tuple(errors)


# What a fetch raises when the Hub cannot be reached or answers nonsense.
_FETCH_ERRORS: tuple[type[BaseException], ...] = (
    OfflineModeIsEnabled,
    FileMetadataError,
    *_transport_errors(),
)


@dataclass(frozen=True)
class _Hub:
    """The Hub settings in force for one fetch."""

    endpoint: str
    cache_dir: str
    offline: bool


def hub_endpoint(repo: str) -> str:
    """The endpoint `repo` (ORG/NAME) is fetched from: its organisation's mirror, else
    HF_ENDPOINT, else the Hub's."""
    mirror = hub_mirrors(os.environ.get(ENV_MIRRORS, "")).get(repo.split("/", 1)[0])
    return mirror or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def _hub_settings(repo: str) -> _Hub:
    endpoint = hub_endpoint(repo)
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub")
        if os.environ.get("HF_HOME")
        else constants.HF_HUB_CACHE
    )
    offline_env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    offline = offline_env in {"1", "ON", "YES", "TRUE"} or constants.HF_HUB_OFFLINE
    return _Hub(
        endpoint=endpoint.rstrip("/"), cache_dir=os.path.expanduser(cache_dir), offline=offline
    )


async def fetch_hf_model(
    repo: str, revision: str | None, *, files: Sequence[tuple[str, int]] = ()
) -> tuple[dict[str, object], int]:
    """Fetch a Hugging Face repo's `config.json` and the size of its weights.

    Args:
        repo: `ORG/NAME`.
        revision: a branch, tag or commit; None for the repo's default branch.
        files: the catalog's file list `(path, bytes)`; when it names weight files their sizes
            are the weights' bytes and the Hub is not asked.

    Returns:
        The parsed config and the weights' bytes (0 when they cannot be known; offline, only
        `files` can tell them).

    Raises:
        SourceUnreachable: the repo, revision or config.json is missing, gated, private, not
            cached while offline, or the Hub could not be reached.
        InvalidShape: the repo id is malformed, or config.json is too large, not JSON or not a
            JSON object.
    """
    source = f"hf://{repo}" + (f"@{revision}" if revision else "")
    why = revision_problem(revision) if revision is not None else ""
    if why:
        # Checked here too (the resolver does first): refs/REVISION is a path in the cache.
        raise InvalidShape(f"{source[:200]} is refused: {why}.", source=source[:200])
    hub = _hub_settings(repo)
    budget = current_budget() or FetchBudget(DEFAULT_FETCH_LIMITS, source)
    path = await asyncio.to_thread(_download_config, repo, revision, hub, source)
    config = _read_config(path, source)
    weights = weight_bytes_from_files(files, source=source)
    if weights == 0 and not hub.offline:
        weights = await _weights_from_hub(repo, revision, hub, budget, source)
    return config, weights


def _download_config(repo: str, revision: str | None, hub: _Hub, source: str) -> Path:
    """config.json's path in the local cache, downloaded first when the cache lacks it."""
    try:
        # A dry run first: it tells the file's size before anything is downloaded, and
        # where the cached copy is when it is current (then nothing more is asked).
        info = hf_hub_download(
            repo,
            CONFIG_FILE,
            revision=revision,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            local_files_only=hub.offline,
            dry_run=True,
        )
        if info.file_size is not None and info.file_size > MAX_CONFIG_BYTES:
            raise InvalidShape(
                f"{source}'s config.json is {info.file_size} bytes, more than the "
                f"{MAX_CONFIG_BYTES} a config can be.",
                source=source,
            )
        budget = current_budget()  # this runs on a worker thread, in the caller's context
        if budget is not None:
            budget.charge_file(CONFIG_FILE)
            budget.charge_bytes(info.file_size or 0, CONFIG_FILE)
        _check_in_cache(info.local_path, info.commit_hash, hub, source)
        if not info.will_download:
            return Path(info.local_path)
        path = hf_hub_download(
            repo,
            CONFIG_FILE,
            revision=revision,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            local_files_only=hub.offline,
        )
        _check_in_cache(path, None, hub, source)
        return Path(path)
    except HFValidationError as error:
        raise InvalidShape(
            f"{repo!r} is not a Hugging Face repo id (ORG/NAME): {_first_line(error)}",
            source=source,
        ) from error
    except GatedRepoError as error:
        raise SourceUnreachable(
            f"{source} is gated: set HF_TOKEN to a token that has been granted access to it.",
            source=source,
        ) from error
    except RepositoryNotFoundError as error:
        raise SourceUnreachable(
            f"{source} was not found on {hub.endpoint} (if it is private, set HF_TOKEN).",
            source=source,
        ) from error
    except RevisionNotFoundError as error:
        raise SourceUnreachable(
            f"{source}: revision {revision!r} was not found on {hub.endpoint}.", source=source
        ) from error
    except LocalEntryNotFoundError as error:
        # One text for every transport failure: refused, reset, timed out and not-HTTP ports
        # read the same (policy.network_failure's rule).
        where = (
            "HF_HUB_OFFLINE is set"
            if hub.offline
            else f"{hub.endpoint} could not be reached (is this machine offline?)"
        )
        raise SourceUnreachable(
            f"{source}'s config.json is not in the local cache and {where}.", source=source
        ) from error
    except EntryNotFoundError as error:
        raise SourceUnreachable(f"{source} has no config.json.", source=source) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise SourceUnreachable(
            f"{hub.endpoint} answered HTTP {status} for {source}'s config.json.", source=source
        ) from error
    except _FETCH_ERRORS as error:
        log.info("hf_fetch_failed", source=source, error=_first_line(error))
        raise SourceUnreachable(
            f"{source}'s config.json could not be fetched: {hub.endpoint} could not be reached "
            "(no HTTP answer came back: is this machine offline?).",
            source=source,
        ) from error


def _check_in_cache(path: str, commit: str | None, hub: _Hub, source: str) -> None:
    """SourceUnreachable unless `path` lies inside the cache folder and `commit` (the Hub's
    answer, which names a snapshot folder) is a commit hash: a hostile endpoint cannot make
    the planner write elsewhere."""
    cache = os.path.realpath(hub.cache_dir)
    real = os.path.realpath(path)
    if (commit is not None and not _COMMIT.fullmatch(commit)) or os.path.commonpath(
        [cache, real]
    ) != cache:
        raise SourceUnreachable(
            f"{hub.endpoint} answered {source} with a commit or path outside the cache "
            f"({cache}); nothing was written.",
            source=source,
        )


def _read_config(path: Path, source: str) -> dict[str, object]:
    """The cached config.json, parsed; InvalidShape when it is too large or not a JSON object."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise SourceUnreachable(
            f"{source}'s cached config.json could not be read: {_first_line(error)}", source=source
        ) from error
    if len(raw) > MAX_CONFIG_BYTES:
        raise InvalidShape(
            f"{source}'s config.json is larger than the {MAX_CONFIG_BYTES} bytes a config can be.",
            source=source,
        )
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise InvalidShape(
            f"{source}'s config.json is not valid JSON ({_first_line(error)}).", source=source
        ) from error
    if not isinstance(config, dict):
        raise InvalidShape(
            f"{source}'s config.json is a JSON {type(config).__name__}, not an object.",
            source=source,
        )
    return config


def weight_bytes_from_files(files: Iterable[tuple[str, int]], *, source: str = "") -> int:
    """The bytes of a repo's weights from its file list.

    One format is counted, so a repo that ships the same weights twice is not counted twice:
    `*.safetensors` (leaving out Mistral's `consolidated*.safetensors` when sharded files are
    there too), else PyTorch's `*.bin`/`*.pt`/`*.pth`, else `*.gguf`. Files at the repo's top
    level are preferred over files in folders (Llama repos keep an `original/` copy).

    Args:
        files: `(path, bytes)` pairs.
        source: named in the error message.

    Returns:
        The summed size, 0 when no weight file is listed.

    Raises:
        InvalidShape: a path is not text or a size is not a whole number of bytes.
    """
    checked: list[tuple[str, int]] = []
    for entry in files:
        path, size = entry
        if not isinstance(path, str) or isinstance(size, bool) or not isinstance(size, int):
            raise InvalidShape(f"file list entry {entry!r} is not (path, bytes).", source=source)
        if not 0 <= size <= _MAX_FILE_BYTES:
            raise InvalidShape(
                f"file {path!r} has an impossible size of {size} bytes.", source=source
            )
        checked.append((path.lower(), size))
    top = [(path, size) for path, size in checked if "/" not in path]
    for pool in (top, checked):
        for suffixes in (_SAFETENSORS, _PYTORCH, _GGUF):
            chosen = [(path, size) for path, size in pool if path.endswith(suffixes)]
            if suffixes is _SAFETENSORS and any(
                not path.rsplit("/", 1)[-1].startswith("consolidated") for path, _ in chosen
            ):
                chosen = [
                    (path, size)
                    for path, size in chosen
                    if not path.rsplit("/", 1)[-1].startswith("consolidated")
                ]
            if chosen:
                return sum(size for _, size in chosen)
    return 0


async def _weights_from_hub(
    repo: str, revision: str | None, hub: _Hub, budget: FetchBudget, source: str
) -> int:
    """The weights' bytes as the Hub describes them: the safetensors headers' tensor bytes
    (read within `budget`, `hf_weights`), else the repo's file sizes; 0 when neither can be
    read. A refusal of the budget or of a hostile index is raised, never taken for "unknown".
    """
    try:
        total = await safetensors_weight_bytes(
            hub.endpoint, repo, revision, budget, token=get_token(), source=source
        )
        if total > 0:
            return total
    except (NotOnHub, Unreadable) as error:  # only "not from safetensors headers"
        log.info("hf_safetensors_metadata_unavailable", repo=repo, error=_first_line(error))
    budget.charge_file("the repo's file list")
    return await asyncio.to_thread(_weights_from_file_list, repo, revision, hub)


def _weights_from_file_list(repo: str, revision: str | None, hub: _Hub) -> int:
    """The weights' bytes from the repo's file sizes (its model info); 0 when unknown."""
    api = HfApi(endpoint=hub.endpoint)
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True)
        listed = [
            (sibling.rfilename, sibling.lfs.size if sibling.lfs else (sibling.size or 0))
            for sibling in info.siblings or ()
        ]
        return weight_bytes_from_files(listed)
    except Exception as error:  # unknown weights are 0, never a failure of the fetch
        log.info("hf_weights_unknown", repo=repo, error=_first_line(error))
        return 0


def _first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (huggingface_hub's run to several)."""
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= 160 else line[:157] + "..."
