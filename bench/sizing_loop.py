"""Bench: a fresh SizeContext's CPU in process, by context bucket, sizing alone and handler.

`planner_throughput` measures a child planner through gRPC, where the machine's other load and
gRPC's own cost blur what the sizing itself takes. This loop measures the two parts the
planner's code decides, in this process, with no network:

- sizing: `planner_svc.domain.context.size_context` of the cached GGUF model
  `planner_throughput` asks about (a vLLM profile with no version named), each call a context
  never asked before;
- handler: the servicer's `SizeContext` called directly (the shape resolved once and cached,
  as in the server; the `context_sized` line written as JSON to /dev/null), each call a request
  never asked before, so no remembered answer serves it.

Contexts fall in three buckets that cost differently: <= 8,192 tokens, 8,193-32,768 (where an
unknown vLLM version's profiling batch is the context) and above. Each figure is the best of
`repeats` runs of `calls` calls (process CPU, `time.process_time`, per call).

Run: `.venv/bin/python -m bench.sizing_loop [--calls N] [--repeats R]`. To count instructions
instead (deterministic on a shared machine): `valgrind --tool=callgrind .venv/bin/python -m
bench.sizing_loop --count N --part sizing|handler --bucket BUCKET` at two counts; the
difference of the totals over the difference of the counts is one call's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from bench.planner_throughput import INVENTORY, size_request, vllm_model, write_model_gguf
from llmgw.logs import configure_logging
from planner_svc.domain.context import size_context
from planner_svc.rpc import decoded
from planner_svc.rpc.placing import PlanCosts
from planner_svc.rpc.servicer import PlannerServicer
from planner_svc.sources.resolver import ShapeResolver

BUCKETS: dict[str, tuple[int, int]] = {
    "<= 8k": (1024, 8192),
    "8k-32k": (8193, 32768),
    "> 32k": (32769, 121_023),
}
"""Context buckets, first and last token count asked in each."""


class _Context:
    """The little of a grpc.aio servicer context the SizeContext path reads on an answer."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, Any]:
        return {}


def _contexts(first: int, last: int) -> itertools.cycle[int]:
    """Contexts spread over [first, last] (a prime stride, so consecutive ones differ)."""
    span = last - first + 1
    return itertools.cycle(first + (i * 7919) % span for i in range(span))


def _best_per_call_us(run: Callable[[int], None], calls: int, repeats: int) -> float:
    """The best of `repeats` runs of `run(calls)`, in process CPU µs per call."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.process_time()
        run(calls)
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


def measure(calls: int, repeats: int, folder: Path) -> dict[str, float]:
    """The figures: `sizing_{bucket}_us` and `handler_{bucket}_us` per bucket."""
    request = size_request(vllm_model(source=str(write_model_gguf(folder))))
    resolver = ShapeResolver()
    servicer = PlannerServicer(resolver)
    loop = asyncio.new_event_loop()
    try:
        shape = loop.run_until_complete(resolver.resolve(request.model.source))
        model_of, inventory_of = decoded.decoders()
        model = model_of(request.model)
        inventory = inventory_of(INVENTORY)
        context = _Context()
        figures: dict[str, float] = {}
        seen: set[int] = set()
        for bucket, (first, last) in BUCKETS.items():
            contexts = _contexts(first, last)

            def sizing(n: int, contexts: itertools.cycle[int] = contexts) -> None:
                for _ in range(n):
                    size_context(model, shape, tokens=next(contexts), slots=0, inventory=inventory)

            figures[f"sizing_{bucket}_us"] = _best_per_call_us(sizing, calls, repeats)
            # Handler: every request new (a token count not asked before in this process),
            # so the servicer's remembered answers never serve one.
            fresh = (t for t in itertools.count(first) if t not in seen)

            async def handle(
                n: int, fresh: Any = fresh, last: int = last, bucket: str = bucket
            ) -> None:
                for _ in range(n):
                    tokens = next(fresh)
                    if tokens > last:
                        raise RuntimeError(f"bucket {bucket} ran out of new contexts")
                    seen.add(tokens)
                    request.tokens = tokens
                    await servicer.SizeContext(request, context)  # type: ignore[arg-type]

            def handled(n: int, handle: Callable[[int], Any] = handle) -> None:
                loop.run_until_complete(handle(n))

            figures[f"handler_{bucket}_us"] = _best_per_call_us(handled, calls, repeats)
    finally:
        loop.close()
    return figures


def report(figures: dict[str, float], calls: int, repeats: int) -> None:
    """Print the figures as a table."""
    print(f"in process, best of {repeats} x {calls} new contexts; process CPU per call")
    print(f"{'context':<10} {'size_context':>14} {'SizeContext handler':>21}")
    for bucket in BUCKETS:
        print(
            f"{bucket:<10} {figures[f'sizing_{bucket}_us']:>11.1f} us "
            f"{figures[f'handler_{bucket}_us']:>18.1f} us"
        )


def run(calls: int = 400, repeats: int = 7) -> dict[str, float]:
    """The benchmark; prints its table, returns its figures. The JSON log goes to /dev/null."""
    with open(os.devnull, "w") as null, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        stderr, sys.stderr = sys.stderr, null
        try:
            configure_logging(json_logs=True)
            figures = measure(calls, repeats, Path(tmp))
        finally:
            sys.stderr = stderr
            structlog.reset_defaults()
    report(figures, calls, repeats)
    return figures


def count_run(part: str, bucket: str, count: int) -> None:
    """`count` + 50 fresh calls of `part` ("sizing" or "handler") in `bucket`, untimed: run
    under `valgrind --tool=callgrind` at two counts, the difference of their instructions
    over the difference of the counts is a call's, whatever the machine's load. The JSON log
    goes to /dev/null."""
    first, last = BUCKETS[bucket]
    span = last - first + 1
    tokens = [first + (i * 7919) % span for i in range(count + 50)]
    if len(set(tokens)) != len(tokens):
        raise SystemExit(f"bucket {bucket} holds fewer than {count + 50} contexts")
    with open(os.devnull, "w") as null, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        stderr, sys.stderr = sys.stderr, null
        try:
            configure_logging(json_logs=True)
            request = size_request(vllm_model(source=str(write_model_gguf(Path(tmp)))))
            resolver = ShapeResolver()
            servicer = PlannerServicer(resolver)
            # Under valgrind every plan takes far more than the on-loop budget
            # (placing.INLINE_PLAN_S), so each would go to the planning thread and the count
            # would carry that hop (~150,000 instructions a call); the server, at full speed,
            # runs these plans on the loop. No budget here, so the counted path is the
            # server's.
            servicer._costs = PlanCosts(budget_s=float("inf"))
            loop = asyncio.new_event_loop()
            shape = loop.run_until_complete(resolver.resolve(request.model.source))
            model_of, inventory_of = decoded.decoders()
            model, inventory = model_of(request.model), inventory_of(INVENTORY)
            if part == "sizing":
                for t in tokens:
                    size_context(model, shape, tokens=t, slots=0, inventory=inventory)
            else:

                async def handle() -> None:
                    for t in tokens:
                        request.tokens = t
                        await servicer.SizeContext(request, _Context())  # type: ignore[arg-type]

                loop.run_until_complete(handle())
            loop.close()
        finally:
            sys.stderr = stderr
            structlog.reset_defaults()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--calls` and `--repeats` (or `--count`, `--part`, `--bucket`), run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=400, help="calls a run (default 400)")
    parser.add_argument("--repeats", type=int, default=7, help="runs a figure (default 7)")
    parser.add_argument(
        "--count", type=int, default=0, help="untimed: this many calls + 50, for callgrind"
    )
    parser.add_argument("--part", choices=("sizing", "handler"), default="sizing")
    parser.add_argument("--bucket", choices=list(BUCKETS), default="> 32k")
    opts = parser.parse_args(argv)
    if opts.count:
        count_run(opts.part, opts.bucket, opts.count)
        return
    run(opts.calls, opts.repeats)


if __name__ == "__main__":
    main()
