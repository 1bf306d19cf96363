"""llama.cpp's cache rules replayed against what real llama.cpp runs printed
(tests/fixtures/ground_truth/observations.jsonl, see its PROVENANCE.md).

Each usable llama.cpp row goes through `llamacpp_cache` with the row's flags (as llama-server
arguments) and a shape built inline from the row's `arch` numbers; the KV sizes must come out
as printed, to the two decimals of MiB llama.cpp prints. Rows whose llama.cpp version had other
rules are listed in NOT_REPRODUCED with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.engines.llamacpp import (
    MIB,
    llamacpp_cache,
    llamacpp_kv_bytes,
    llamacpp_overhead_bytes,
    settings_from_args,
)
from llmgw.engines.llamacpp.overhead import VOCAB_BOUND, activation_width
from llmgw.shape import Compute, Layer, LayerKind, ModelShape
from tests.oracle.llamacpp_run import printed_mib

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ground_truth" / "observations.jsonl"

Row = Mapping[str, Any]


def _llamacpp_rows() -> dict[str, Row]:
    """The fixture's llama.cpp rows by id."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    return {row["id"]: row for row in rows if row["engine"] == "llama.cpp"}


ROWS = _llamacpp_rows()

NOT_REPRODUCED: dict[str, str] = {
    "gt-012": (
        "llama-cpp-python of March 2024: its llama.cpp kept n_ctx 13000 unpadded (this one pads "
        "to 13056 cells) and ignored the requested q4_0 cache (this one turns flash attention "
        "on and quantizes it); the row also prints only one card's share (27 of 80 layers)"
    ),
}
"""Rows whose llama.cpp version had rules this one does not, with the reason."""

REPLAYED = sorted(set(ROWS) - set(NOT_REPRODUCED))

# Attention heads, which the rows' `arch` leaves out and only the compute-buffer estimate uses:
# num_attention_heads of each model's Hugging Face config.json.
ATTENTION_HEADS = {
    "qwen3-8b": 32,  # Qwen/Qwen3-8B
    "llama-3.x-70b": 64,  # meta-llama/Llama-3.1-70B
    "llama-3.1-405b": 128,  # meta-llama/Llama-3.1-405B
    "qwen2.5-3b": 16,  # Qwen/Qwen2.5-3B-Instruct
    "qwen2.5-32b": 40,  # Qwen/Qwen2.5-32B-Instruct
    "phi-3-mini": 32,  # microsoft/Phi-3-mini-4k-instruct
    "gpt-oss-120b": 64,  # openai/gpt-oss-120b
    "gemma-3-4b": 8,  # google/gemma-3-4b-it
    "deepseek-v2-lite": 16,  # deepseek-ai/DeepSeek-V2-Lite-Chat
    "mixtral-8x7b": 32,  # mistralai/Mixtral-8x7B-Instruct-v0.1
}


def shape_from_arch(row: Row) -> ModelShape:
    """A shape from a row's `arch` numbers: full layers; sliding and full layers by the counts
    given (gpt-oss, Gemma 3); or DeepSeek-2 attention, which a file without key_length_mla
    (the row's log says n_embd_head_k_mla=0) caches as full heads of (nope + rope, v_head)."""
    arch = row["arch"]
    kv = int(arch.get("kv_heads", 0))
    head = int(arch.get("head_dim", 0))
    full = Layer(LayerKind.FULL, kv_heads=kv, head_dim_k=head, head_dim_v=head)
    if arch.get("mla"):
        assert "n_embd_head_k_mla=0" in row["model"] + arch["src"], "only legacy MLA rows"
        k_head = int(arch["qk_nope_head_dim"]) + int(arch["qk_rope_head_dim"])
        heads = int(arch["n_heads"])
        full = Layer(LayerKind.FULL, heads, k_head, int(arch["v_head_dim"]))
        layers = [full] * int(arch["layers"])
    elif "swa_layers" in arch:
        sliding = Layer(LayerKind.SLIDING, kv, head, head, int(arch["sliding_window"]))
        layers = [sliding] * int(arch["swa_layers"]) + [full] * int(arch["full_layers"])
    else:
        layers = [full] * int(arch["layers"])
    return ModelShape(
        architecture="deepseek2" if arch.get("mla") else "llama",
        layers=tuple(layers),
        attention_heads=ATTENTION_HEADS[row["arch_key"]],
        kv_heads=max(la.kv_heads for la in layers),
        trained_context=int(arch.get("max_pos", 0)),
    )


def row_args(row: Row) -> list[str]:
    """The row's flags as llama-server arguments: its context and slots (1 when it does not
    say: the library and CLI runs these come from hold one sequence), cache types (LM Studio's
    "fp16" is f16), flash attention (0/1/auto), ubatch and batch, full-size SWA cache."""
    flags = row["flags"]
    cache = str(flags.get("cache_type", "f16")).replace("fp16", "f16")
    args = [
        "--ctx-size",
        str(flags["n_ctx"]),
        "--parallel",
        str(flags.get("n_seq_max", 1)),
        "--cache-type-k",
        str(flags.get("cache_type_k", cache)),
        "--cache-type-v",
        str(flags.get("cache_type_v", cache)),
        "--ubatch-size",
        str(flags.get("n_ubatch", flags.get("n_ubatch_default", 512))),
        "--batch-size",
        str(flags.get("n_batch", 2048)),
    ]
    fa = flags.get("flash_attn")
    if fa is not None:
        args += ["--flash-attn", {0: "off", 1: "on"}.get(fa, "auto")]
    if flags.get("kv_unified"):
        args.append("--kv-unified")
    if flags.get("swa_full"):
        args.append("--swa-full")
    return args


def test_not_reproduced_names_exactly_the_rows_skipped() -> None:
    """Every llama.cpp row is either replayed or named with a reason, none both."""
    assert set(NOT_REPRODUCED) <= set(ROWS)
    assert set(REPLAYED) | set(NOT_REPRODUCED) == set(ROWS)
    assert not set(REPLAYED) & set(NOT_REPRODUCED)
    assert len(REPLAYED) >= 10


@pytest.mark.parametrize("row_id", REPLAYED)
def test_kv_cache_as_printed(row_id: str) -> None:
    """The planner's KV cache (total, K, V, cells; both caches of a sliding-window model)
    comes out as llama.cpp printed it."""
    row = ROWS[row_id]
    printed = row["printed"]
    shape = shape_from_arch(row)
    args = row_args(row)
    cache = llamacpp_cache(shape, settings_from_args(args))
    if "swa_kv_mib" in printed:
        assert printed_mib(cache.full_bytes) == f"{printed['nonswa_kv_mib']:.2f}"
        assert printed_mib(cache.swa_bytes) == f"{printed['swa_kv_mib']:.2f}"
        cells = printed.get("cells_each")
        assert cache.full_cells == printed.get("nonswa_cells", cells)
        assert cache.swa_cells == printed.get("swa_cells", cells)
        return
    total = printed.get("kv_total_mib", printed.get("kv_self_mib"))
    assert printed_mib(cache.total_bytes) == f"{total:.2f}"
    assert llamacpp_kv_bytes(shape, args) == cache.total_bytes
    if "k_mib" in printed:
        assert printed_mib(cache.k_bytes) == f"{printed['k_mib']:.2f}"
        assert printed_mib(cache.v_bytes) == f"{printed['v_mib']:.2f}"
    cells = printed.get("cells", printed.get("kv_size_cells"))
    if cells is not None:
        assert cache.full_cells == cells


COMPUTE_ROWS = sorted(
    row_id for row_id in REPLAYED if any("compute" in key for key in ROWS[row_id]["printed"])
)


@pytest.mark.parametrize("row_id", COMPUTE_ROWS)
def test_overhead_bounds_printed_compute_buffers(row_id: str) -> None:
    """The per-card overhead estimate is at least every compute buffer the row printed."""
    row = ROWS[row_id]
    buffers = [v for k, v in row["printed"].items() if "compute" in k]
    overhead = llamacpp_overhead_bytes(shape_from_arch(row), row_args(row), 1)
    assert overhead >= max(buffers) * MIB


# The widths a GGUF's header gives (embedding_length, feed_forward_length, expert counts and
# widths, vocabulary), as each model's Hugging Face config.json states them.
WIDTHS = {
    "qwen3-8b": Compute(4096, 12288, 151936),  # Qwen/Qwen3-8B
    "llama-3.x-70b": Compute(8192, 28672, 128256),  # meta-llama/Llama-3.1-70B
    "llama-3.1-405b": Compute(16384, 53248, 128256),  # meta-llama/Llama-3.1-405B
    "qwen2.5-3b": Compute(2048, 11008, 151936),  # Qwen/Qwen2.5-3B-Instruct
    "qwen2.5-32b": Compute(5120, 27648, 152064),  # Qwen/Qwen2.5-32B-Instruct
    "phi-3-mini": Compute(3072, 8192, 32064),  # microsoft/Phi-3-mini-4k-instruct
    "gpt-oss-120b": Compute(2880, 2880, 201088, 128, 4, 2880),  # openai/gpt-oss-120b
    "gemma-3-4b": Compute(2560, 10240, 262208),  # google/gemma-3-4b-it
    # deepseek-ai/DeepSeek-V2-Lite-Chat: 64 routed experts of 1408, 6 a token, 2 shared, the
    # first layer dense (10944).
    "deepseek-v2-lite": Compute(2048, 10944, 102400, 64, 6, 1408, 2 * 1408, 1),
    "mixtral-8x7b": Compute(4096, 14336, 32000, 8, 2, 14336),  # mistralai/Mixtral-8x7B-v0.1
}


@pytest.mark.parametrize("row_id", COMPUTE_ROWS)
def test_overhead_from_the_models_widths_bounds_printed_compute_buffers(row_id: str) -> None:
    """With the widths a GGUF header gives (hidden, FFN, experts, vocabulary) the estimate
    still bounds every compute buffer the row printed, and comes closer to it where the
    vocabulary is below the 262144 bound (its own logits counted, not the bound's)."""
    row = ROWS[row_id]
    buffers = [v for k, v in row["printed"].items() if "compute" in k]
    bare = shape_from_arch(row)
    compute = WIDTHS[row["arch_key"]]
    sized = llamacpp_overhead_bytes(replace(bare, compute=compute), row_args(row), 1)
    assert sized >= max(buffers) * MIB
    if compute.vocab_size < VOCAB_BOUND:  # every row but Gemma 3's (262,208 tokens)
        assert sized < llamacpp_overhead_bytes(bare, row_args(row), 1)
    assert activation_width(compute, compute.hidden_size) >= 12 * compute.hidden_size
