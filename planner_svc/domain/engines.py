"""The engines the planner knows: how each takes a context and a count of cards."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CardSplit(enum.Enum):
    """How an engine spreads one replica over several cards."""

    TENSOR_PARALLEL = "tensor_parallel"
    """Every layer split across the cards by heads (vLLM, SGLang, TensorRT-LLM)."""
    LAYER_SPLIT = "layer_split"
    """Whole layers placed on each card in turn (llama.cpp `--split-mode layer`)."""
    SINGLE_CARD = "single_card"
    """The engine runs on one card only (embedding servers)."""


@dataclass(frozen=True)
class Engine:
    """What the planner needs to know of one engine.

    `context_flags` are the flag and its aliases that set the context (empty: the engine takes
    no context this way); `card_flags` set the count of cards; `drop_flags` are removed when
    the count changes (llama.cpp's `--tensor-split` no longer matches new cards).
    """

    name: str
    split: CardSplit
    context_flags: tuple[str, ...] = ()
    card_flags: tuple[str, ...] = ()
    drop_flags: tuple[tuple[str, ...], ...] = ()
    slots_flags: tuple[str, ...] = ()
    joined_ok: bool = True
    """Whether the engine's parser takes `--flag=value` (llama-server's does not: it has no
    `=` split in common_params_parse_ex, so `--ctx-size=4096` stops it at start)."""


# Flags as each engine's own CLI spells them: vLLM `vllm serve --help` (engine args),
# SGLang `python -m sglang.launch_server --help` (server_args.py), TensorRT-LLM
# `trtllm-serve --help`, llama.cpp `llama-server --help` (common/arg.cpp).
VLLM = Engine(
    name="vllm",
    split=CardSplit.TENSOR_PARALLEL,
    context_flags=("--max-model-len",),
    card_flags=("--tensor-parallel-size", "-tp"),
)
SGLANG = Engine(
    name="sglang",
    split=CardSplit.TENSOR_PARALLEL,
    context_flags=("--context-length",),
    card_flags=("--tp-size", "--tp"),
)
TRTLLM = Engine(
    name="trtllm",
    split=CardSplit.TENSOR_PARALLEL,
    context_flags=("--max_seq_len",),
    card_flags=("--tp_size",),
)
LLAMACPP = Engine(
    name="llamacpp",
    split=CardSplit.LAYER_SPLIT,
    context_flags=("--ctx-size", "-c"),
    card_flags=("--split-mode", "-sm"),
    drop_flags=(("--tensor-split", "-ts"),),
    slots_flags=("--parallel", "-np"),
    joined_ok=False,
)
# One-card servers seen in llmgw catalogs: Hugging Face text-embeddings-inference and
# infinity serve embeddings and rerankers on a single card.
TEI = Engine(name="tei", split=CardSplit.SINGLE_CARD)
INFINITY = Engine(name="infinity", split=CardSplit.SINGLE_CARD)
EMBEDDINGS = Engine(name="embeddings", split=CardSplit.SINGLE_CARD)

ENGINES: dict[str, Engine] = {
    e.name: e for e in (VLLM, SGLANG, TRTLLM, LLAMACPP, TEI, INFINITY, EMBEDDINGS)
}


def engine_named(name: str) -> Engine | None:
    """The engine of that name (case-insensitive, `llama.cpp`/`llama-server` and
    `trtllm-serve`/`tensorrt-llm` accepted), None when unknown."""
    key = name.strip().lower()
    aliases = {
        "llama.cpp": "llamacpp",
        "llama-server": "llamacpp",
        "trtllm-serve": "trtllm",
        "tensorrt-llm": "trtllm",
        "tensorrt_llm": "trtllm",
    }
    return ENGINES.get(aliases.get(key, key))
