"""The size limits every llmgw server holds a request to, and the refusal of one past them.
Pure: the servers read them from their environment (`Limits.from_env`) and check them at the
process edge (llmgw.rpc.intake for the bytes, llmgw.rpc.common for the counts), before any
work."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from llmgw.model import InvalidValue


@dataclass
class LimitExceeded(InvalidValue):
    """A request holds more of something than the server's limit; `limit` names the limit
    (a `Limits` field), `count` is what the request holds."""

    limit: str = ""
    maximum: int = 0
    count: int = 0
    reason: str = "LIMIT_EXCEEDED"

    def metadata(self) -> dict[str, str]:
        return {
            "field": self.field,
            "limit": self.limit,
            "maximum": str(self.maximum),
            "count": str(self.count),
        }


@dataclass(frozen=True)
class Limits:
    """How much one request may hold. The defaults are far past any real model's catalog entry
    (the largest reference catalogs have a handful of profiles of a few dozen arguments) and
    small enough that one request's work stays in milliseconds."""

    max_message_bytes: int = 1 << 20
    """A request's serialized bytes. 1 MiB, a quarter of gRPC's default receive limit (4 MiB):
    an answer carries each profile's arguments three times (the change's before and after, the
    updated profile), so it is about three times its request, and stays under the 4 MiB every
    gRPC caller (the Go gateway, grpcurl) accepts by default. gRPC core's own limit is set well
    above this (`llmgw.rpc.intake.core_limit`), so a request past it is refused with ErrorInfo
    (MESSAGE_TOO_LARGE)."""
    max_profiles: int = 64
    """Profiles of one model."""
    max_args: int = 256
    """Arguments of one profile."""
    max_arg_bytes: int = 64 << 10
    """Characters of one argument (a chat template given inline is a few KiB)."""
    max_files: int = 4096
    """Files of one model's origin."""
    max_nodes: int = 4096
    """Nodes of one inventory."""
    max_streams_per_identity: int = 256
    """WatchReplicas and WatchRollout streams one caller holds open at once (a gateway holds
    one WatchReplicas per fleet; an operator a few). Agents' Connect streams are apart."""
    max_streams: int = 8192
    """Such streams of every caller together; admins' are not counted against it."""
    max_inflight_per_identity: int = 64
    """Unary calls one caller has in flight at once."""
    max_inflight: int = 1024
    """Unary calls in flight from every caller together; admins' and agents' are apart
    (kube-apiserver's --max-requests-inflight is 400 by default)."""
    answer_cache_bytes: int = 64 << 20
    """What the planner's memory of answers may hold, counted in serialized bytes of the
    requests' digests and the answers."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        """Limits from `LLMGW_<FIELD>` variables (e.g. `LLMGW_MAX_PROFILES=128`); the defaults
        for the rest.

        Raises:
            ValueError: a variable that is not a positive whole number.
        """
        values: dict[str, int] = {}
        for f in fields(cls):
            name = f"LLMGW_{f.name.upper()}"
            raw = env.get(name, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if value < 1:
                raise ValueError(f"{name}={raw!r}: give a positive whole number")
            values[f.name] = value
        return cls(**values)

    def check_count(self, count: int, limit: str, field: str) -> None:
        """Refuse `count` items of `field` past the limit named `limit`.

        Raises:
            LimitExceeded: past it.
        """
        maximum: int = getattr(self, limit)
        if count > maximum:
            raise LimitExceeded(
                f"{field} holds {count}, more than this server's {limit} ({maximum}): send fewer",
                field=field,
                limit=limit,
                maximum=maximum,
                count=count,
            )


DEFAULT_LIMITS = Limits()
"""The limits a server holds to when its environment sets none."""
