"""A replica as the agent knows it: what the fleet wants (spec) and what runs (observation)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmgw.engines.gang import MemberOrder


@dataclass(frozen=True)
class ReplicaSpec:
    """What the fleet wants running: an engine by name, its arguments and cards (the agent
    protocol's `ReplicaSpec`, field for field).

    Two specs with the same `replica_id` and `revision` are the same command: the agent runs it
    once however often it is sent.
    """

    replica_id: str
    revision: int
    engine: str
    model: str = ""
    profile: str = ""
    args: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    source: str = ""
    gang: MemberOrder | None = None
    """Set for a member of a gang: what it is told of its gang; started with its engine's
    multi-node launch."""
    traceparent: str = ""
    """The W3C trace context of the request that asked for it ("" untraced): its start and
    health checks are a child span of that trace. Not part of the command (`key`)."""

    @property
    def key(self) -> tuple[str, int]:
        """(replica_id, revision): what makes two commands the same."""
        return (self.replica_id, self.revision)


class Phase(enum.Enum):
    """What the agent observes of a replica's engine process (the proto's ProcessPhase)."""

    STARTING = "STARTING"
    """The process runs, and its health path does not answer 200 yet or its model list
    (`EngineConfig.models_path`) does not name the served model yet."""
    HEALTHY = "HEALTHY"
    """The process runs, its health path answers 200, and (checked until it first does) its
    model list names the served model."""
    UNHEALTHY = "UNHEALTHY"
    """The process answered 200 before and has failed the last N health checks since."""
    CRASHED = "CRASHED"
    """The process exited (or never became healthy in time) without being asked to stop; it
    will be started again after a backoff."""
    STOPPING = "STOPPING"
    """The agent sent SIGTERM and the process has not exited yet."""
    STOPPED = "STOPPED"
    """The process is gone after being asked to stop, and its cards' memory is released."""
    FAILED = "FAILED"
    """The agent will not run it (again): refused, or crashed past the restart limit."""


class Stage(enum.Enum):
    """Where a STARTING replica stands (the proto's StartStage)."""

    DOWNLOADING = "DOWNLOADING"
    """Its model's files are being fetched: by the agent (a GGUF URL), or by the engine into
    the Hub cache (a Hugging Face repo, `.incomplete` files there)."""
    LOADING = "LOADING"
    """Its engine process runs and has not passed its health check yet."""


@dataclass(frozen=True)
class Progress:
    """How far a starting replica got: its stage, bytes (`total_bytes` 0: not known), the
    recent rate, whole files of how many, and the file's name."""

    stage: Stage
    done_bytes: int = 0
    total_bytes: int = 0
    rate_bytes_per_s: int = 0
    files_done: int = 0
    files_total: int = 0
    file: str = ""


@dataclass(frozen=True)
class Observation:
    """One replica's state as the agent reports it; `since_s` is wall-clock seconds."""

    spec: ReplicaSpec
    phase: Phase
    address: str = ""
    pid: int = 0
    restarts: int = 0
    exit_code: int = 0
    message: str = ""
    log_tail: tuple[str, ...] = field(default_factory=tuple)
    since_s: float = 0.0
    gang_address: str = ""
    """host:port a gang member listens on for its gang ("" when it does not)."""
    progress: Progress | None = None
    """While STARTING: what it fetches or loads and how far (None: nothing to tell)."""
