"""The gRPC service config this repository publishes (service_config.json beside this module;
gen/go/client embeds a copy that `make proto` writes and `make proto-check` compares).

It says what a caller of the planner and the fleet may do, for any gRPC client: round_robin
over the addresses a name resolves to (a headless Service's pods), and a retryPolicy on
UNAVAILABLE for the idempotent reads (every planner call, the fleet's List/Get calls) and for
the fleet's writes, which are safe to retry only because each carries a request id fixed
before its first attempt (the fleet answers a repeated id with its first answer).

The Python clients dial with it for its load balancing, and run its retry policy themselves
(llmgw.clients.errors.call: RETRY_ATTEMPTS and RETRY_BACKOFF_S come from here) rather than
through gRPC core's, which would stack on theirs and cannot move to another fleet: their
channels get the config less its retry policies.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SERVICE_CONFIG = resources.files(__package__).joinpath("service_config.json").read_text()
"""The config's JSON, as published."""

_CONFIG: dict[str, Any] = json.loads(SERVICE_CONFIG)


def _seconds(value: str) -> float:
    """A google.protobuf.Duration's JSON ("0.1s") in seconds."""
    if not value.endswith("s"):
        raise ValueError(f"service config: duration {value!r} lacks its s")
    return float(value[:-1])


def retry_policy() -> tuple[int, tuple[float, ...]]:
    """The attempts in all and the waits between them (without gRPC's jitter) of the config's
    retry policy; every method config of it has the same one (tests/unit/test_retry_contract.py)."""
    policies = [mc["retryPolicy"] for mc in _CONFIG["methodConfig"] if "retryPolicy" in mc]
    policy = policies[0]
    if any(p != policy for p in policies):
        raise ValueError("service config: the methods' retry policies differ")
    attempts = int(policy["maxAttempts"])
    first, most = _seconds(policy["initialBackoff"]), _seconds(policy["maxBackoff"])
    factor = float(policy["backoffMultiplier"])
    waits = tuple(round(min(first * factor**n, most), 6) for n in range(attempts - 1))
    return attempts, waits


def without_retry_policies() -> str:
    """The config less its retryPolicy entries: what a client that runs the policy itself
    dials with. gRPC core keeps its transparent retries (of a call that never reached a
    server), which turning retries off (grpc.enable_retries 0) would stop too."""
    config = json.loads(SERVICE_CONFIG)
    for method_config in config["methodConfig"]:
        method_config.pop("retryPolicy", None)
    return json.dumps(config, separators=(",", ":"))


CHANNEL_OPTIONS: list[tuple[str, Any]] = [("grpc.service_config", without_retry_policies())]
"""The channel options that apply it: its load balancing; the retries are the clients' own."""
