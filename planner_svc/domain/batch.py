"""A batch of concurrent requests: each engine's flag for it, and whether that batch of a
context fits a profile's cards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.engines.base import Engine
from planner_svc.domain import errors

MAX_SEQUENCES = 65_536
"""A ceiling on concurrent requests: past it a number is a typo, not a plan."""

SLOTS_ENGINES = ("llamacpp",)
"""Engines whose concurrent requests are their slots (llama-server `--parallel`, 1..64)."""


@dataclass(frozen=True)
class BatchFit:
    """Whether `sequences` requests of `tokens` each fit a profile at once.

    `fits`: the profile's cards hold the engine (the one fits rule) and its KV pool holds the
    whole batch at full length; `contexts_held`: how many requests of `tokens` the pool holds
    (0 when not sized); `flag`: the engine flag the batch was written to."""

    profile: str
    engine: str
    sequences: int
    tokens: int
    fits: bool
    contexts_held: int
    flag: str


def check_sequences(sequences: int) -> None:
    """Refuse a batch size out of range (0 asks for none).

    Raises:
        InvalidRequest: sequences negative or past MAX_SEQUENCES.
    """
    if sequences < 0 or sequences > MAX_SEQUENCES:
        raise errors.InvalidRequest(
            f"{sequences} concurrent requests is out of range: ask for 1 to {MAX_SEQUENCES} "
            "(0 asks for no batch)",
            field="sequences",
        )


def batch_flag(engine: Engine) -> tuple[str, ...]:
    """The flag that caps an engine's concurrent requests (vLLM --max-num-seqs, SGLang
    --max-running-requests, TensorRT-LLM --max_batch_size); () for engines whose batch is
    their slots (llama.cpp --parallel) or that have none."""
    flag = getattr(engine, "batch_flag", ())
    return tuple(flag) if isinstance(flag, tuple) else ()


def with_sequences(engine: Engine, args: Sequence[str], sequences: int) -> list[str]:
    """`args` with the engine's batch flag set to `sequences` (unchanged for 0, or for an
    engine whose batch is its slots: the caller passes them as slots)."""
    flag = batch_flag(engine)
    if sequences <= 0 or not flag:
        return list(args)
    return engine.grammar.set(args, flag, str(sequences))


def slots_for(engine: Engine, slots: int, sequences: int) -> int:
    """The slots to size a profile with: a batch asked of a slot engine is its slots.

    Raises:
        SlotsOutOfRange: a batch past llama.cpp's 64 slots.
    """
    if sequences <= 0 or engine.name not in SLOTS_ENGINES:
        return slots
    if sequences > 64:
        raise errors.SlotsOutOfRange(
            f"llama.cpp serves at most 64 requests at once (--parallel), not {sequences}: ask "
            "for 64 or fewer, or serve the model with vLLM or SGLang",
            slots=sequences,
        )
    return sequences


def batch_fit(
    profile: str,
    engine: Engine,
    *,
    sequences: int,
    tokens: int,
    cards_fit: bool,
    token_capacity: int,
    pooled: bool,
) -> BatchFit:
    """Whether `sequences` requests of `tokens` fit: the cards hold the profile and, for an
    engine whose requests share one pool, the pool's `token_capacity` holds them all (a slot
    engine's slots each hold `tokens` by construction)."""
    held = token_capacity // tokens if pooled and tokens > 0 else (sequences if cards_fit else 0)
    flag = batch_flag(engine)
    spelled = flag[0] if flag else ("--parallel" if engine.name in SLOTS_ENGINES else "")
    return BatchFit(
        profile=profile,
        engine=engine.name,
        sequences=sequences,
        tokens=tokens,
        fits=cards_fit and held >= sequences,
        contexts_held=held,
        flag=spelled,
    )
