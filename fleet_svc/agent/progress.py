"""A starting replica's progress: how often it is reported, and what the Hub cache shows of
an engine's own download.

Progress goes up the agent's one stream to the fleet beside every other report, and the
fleet writes it to its store; a download reporting each chunk would send hundreds of
messages a second. So a replica's progress is reported at most once per `INTERVAL_S` (its
first and last reports always), whatever the chunk size or the link's speed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from fleet_svc.agent.replica import Progress, Stage

INTERVAL_S = 1.0
"""The shortest time between two progress reports of one replica."""

INCOMPLETE = ".incomplete"
"""The suffix huggingface_hub gives a blob while it is downloaded (renamed when whole)."""


class Gate:
    """Lets a replica's progress through at most once per `interval_s`, and measures the
    rate between the reports it lets through.

    Args:
        now: a monotonic clock, in seconds.
        interval_s: the shortest time between two reports.
    """

    def __init__(self, now: Callable[[], float], interval_s: float = INTERVAL_S) -> None:
        self._now = now
        self._interval_s = interval_s
        self._last_s: float | None = None
        self._last_bytes = 0
        self.rate_bytes_per_s = 0
        """The rate between the last two reports let through (0 before the second)."""

    def due(self, done_bytes: int, final: bool = False) -> bool:
        """Whether a report of `done_bytes` goes out now: the first, a final one, or one
        `interval_s` after the last; the rate is updated when it does."""
        now = self._now()
        if self._last_s is not None and not final and now - self._last_s < self._interval_s:
            return False
        if self._last_s is not None and now > self._last_s:
            self.rate_bytes_per_s = max(
                int((done_bytes - self._last_bytes) / (now - self._last_s)), 0
            )
        self._last_s, self._last_bytes = now, done_bytes
        return True


def hub_cache(env: Mapping[str, str]) -> Path:
    """The Hub cache an engine run with `env` downloads into: $HF_HUB_CACHE, else
    $HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's own order)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cache" / "huggingface" / "hub"


def repo_of(source: str) -> str:
    """ORG/NAME of an `hf://ORG/NAME[@REVISION]` source ("" for any other source)."""
    if not source.startswith("hf://"):
        return ""
    repo = source.removeprefix("hf://").split("@", 1)[0].strip("/")
    return repo if repo.count("/") == 1 else ""


def hub_download(cache: Path, repo: str) -> Progress | None:
    """What the Hub cache shows of `repo`'s download: DOWNLOADING while a blob of it is
    incomplete (bytes on disk so far, whole files), None when nothing of it is being
    fetched (absent, or every blob whole). The total is not known here: the engine asks
    the Hub for the file list itself."""
    blobs = cache / ("models--" + repo.replace("/", "--")) / "blobs"
    try:
        entries = list(os.scandir(blobs))
    except OSError:
        return None
    done_bytes = whole = 0
    partial = ""
    for entry in entries:
        try:
            size = entry.stat().st_size
        except OSError:
            continue
        done_bytes += size
        if entry.name.endswith(INCOMPLETE):
            partial = entry.name
        else:
            whole += 1
    if not partial:
        return None
    return Progress(Stage.DOWNLOADING, done_bytes=done_bytes, files_done=whole, file=repo)


class HubWatch:
    """An engine's own download of an hf:// source, as the Hub cache shows it: what to report
    while it starts (gated to one report a second)."""

    def __init__(self, source: str, env: dict[str, str], monotonic: Callable[[], float]) -> None:
        self._repo = repo_of(source)
        self._cache = hub_cache(env)
        self._gate = Gate(monotonic)

    def seen(self, shown: Progress | None) -> Progress | None:
        """The progress to report now, or None (nothing new, or not due yet)."""
        if not self._repo:
            return None
        now = hub_download(self._cache, self._repo)
        if now is None:
            # Nothing incomplete (any more): back to LOADING once a download was shown.
            if shown is not None and shown.stage is Stage.DOWNLOADING:
                return replace(shown, stage=Stage.LOADING, rate_bytes_per_s=0)
            return None
        if now == shown or not self._gate.due(now.done_bytes):
            return None
        return replace(now, rate_bytes_per_s=self._gate.rate_bytes_per_s)
