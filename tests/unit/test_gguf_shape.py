"""shape_from_gguf: real GGUF headers and llama.cpp's per-architecture rules, checked by hand.

Every expected number is derived in the comment beside it: bytes per token are
layers x KV heads x (K + V head size) x 2 B (f16 cache); fixed SWA bytes are sliding layers x
window x KV heads x (K + V) x 2 B; recurrent state is f32: 4 B x ((conv_kernel - 1) x (inner +
2 x groups x state) + state x inner) per layer (llama-hparams.cpp n_embd_r / n_embd_s).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gguf import GGUFValueType

from llmgw.shape import Compute, LayerKind, ModelShape
from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.gguf_shape import shape_from_gguf
from planner_svc.sources.gguf_header import ArraySummary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
FULL, SLIDING, MLA = LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA
RECURRENT, NO_CACHE = LayerKind.RECURRENT, LayerKind.NO_CACHE


def fixture(name: str) -> dict[str, object]:
    """A fixture's metadata: its dotted keys, without the GGUF.* header facts."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if "." in k and not k.startswith("GGUF.")}


def geometry(arch: str, keys: dict[str, object]) -> dict[str, object]:
    """Metadata for `arch` from keys written without the '{arch}.' prefix."""
    md: dict[str, object] = {"general.architecture": arch}
    for key, value in keys.items():
        md[key if key.startswith(("general.", "tokenizer.")) else f"{arch}.{key}"] = value
    return md


@dataclass(frozen=True)
class Expect:
    """What the shape must say."""

    kinds: dict[LayerKind, int]
    attention_heads: int
    kv_heads: int
    head_dim_k: int
    head_dim_v: int
    kv_bytes_per_token: int
    trained_context: int
    kv_bytes_fixed: int = 0
    sliding_window: int = 0
    state_bytes: int = 0
    mla_expanded: tuple[int, int] | None = None
    note: str = ""


@dataclass(frozen=True)
class Case:
    """A header and its expected shape."""

    id: str
    metadata: dict[str, object]
    expect: Expect
    completion: Mapping[str, object] = field(default_factory=dict)


def _with(md: Mapping[str, object], extra: Mapping[str, object]) -> dict[str, object]:
    return {**md, **extra}


# --- Completions for transcribed dumps that do not show every geometry key ------------------
# DeepSeek-V2-Lite: HF config (16 heads, 16 KV heads, qk 128+64 = 192, kv_lora_rank 512), as
# llama.cpp's print_info shows for this file family in ground truth gt-020 (n_head_kv=16,
# n_embd_head_k=192, n_lora_kv=512).
V2_LITE = {
    "deepseek2.attention.head_count": 16,
    "deepseek2.attention.head_count_kv": 16,
    "deepseek2.attention.key_length": 192,
    "deepseek2.attention.kv_lora_rank": 512,
}
# DeepSeek-V3 new format: block/context/width/heads as in the old-format dump of the same
# model; head_count_kv 1 as conversion/deepseek.py writes for MLA files.
V3_NEW = {
    "deepseek2.block_count": 61,
    "deepseek2.context_length": 163840,
    "deepseek2.embedding_length": 7168,
    "deepseek2.attention.head_count": 128,
    "deepseek2.attention.head_count_kv": 1,
}
# Qwen3-Next: HF config (num_hidden_layers 48, max_position_embeddings 262144).
QWEN3_NEXT = {"qwen3next.block_count": 48, "qwen3next.context_length": 262144}
# falcon-mamba-7b: the fixture's own converter-derived block (HF config + conversion/mamba.py).
FALCON_MAMBA = json.loads((FIXTURES / "falcon-mamba-7b-Q4_K_S.json").read_text())[
    "expected_from_converter_not_observed"
]
# gpt-oss-20b: HF config (24 layers, 64 heads, 8 KV heads, head_dim 64, hidden 2880, 131072).
GPT_OSS = {
    "gpt-oss.block_count": 24,
    "gpt-oss.context_length": 131072,
    "gpt-oss.embedding_length": 2880,
    "gpt-oss.attention.head_count": 64,
    "gpt-oss.attention.head_count_kv": 8,
    "gpt-oss.attention.key_length": 64,
}

FIXTURE_CASES = [
    # qwen2, 28 layers x 4 KV x (128 + 128) x 2 = 57,344 (head 3584 / 28 = 128).
    Case(
        "DeepSeek-R1-Distill-Qwen-7B",
        fixture("DeepSeek-R1-Distill-Qwen-7B"),
        Expect({FULL: 28}, 28, 4, 128, 128, 57_344, 131_072),
    ),
    # Old-format deepseek2: llama.cpp caches expanded heads: 27 x 16 x (192 + 128) x 2 =
    # 276,480 B/token (gt-020: 4096 cells -> K 648 + V 432 = 1080 MiB = 4096 x 276,480).
    Case(
        "DeepSeek-V2-Lite-Chat",
        fixture("DeepSeek-V2-Lite-Chat"),
        Expect({FULL: 27}, 16, 16, 192, 128, 276_480, 163_840, note="old-format MLA"),
        V2_LITE,
    ),
    # New-format MLA: one latent of 512 + 64 = 576 per layer, K only: 61 x 576 x 2 = 70,272;
    # TP still splits the 128 original heads.
    Case(
        "DeepSeek-V3_new-MLA-format",
        fixture("DeepSeek-V3_new-MLA-format"),
        Expect({MLA: 61}, 128, 128, 576, 0, 70_272, 163_840, mla_expanded=(192, 128)),
        V3_NEW,
    ),
    # Old format: 61 x 128 x (192 + 128) x 2 = 4,997,120.
    Case(
        "DeepSeek-V3_old-format",
        fixture("DeepSeek-V3_old-format"),
        Expect({FULL: 61}, 128, 128, 192, 128, 4_997_120, 163_840, note="old-format MLA"),
    ),
    # 32 x 8 x (128 + 128) x 2 = 131,072 (4096 / 32 = 128).
    Case(
        "Meta-Llama-3.1-8B-Instruct-Q4_K_M",
        fixture("Meta-Llama-3.1-8B-Instruct-Q4_K_M"),
        Expect({FULL: 32}, 32, 8, 128, 128, 131_072, 131_072),
    ),
    # full_attention_interval 4: layers 3, 7, ..., 47 attend: 12 x 2 x (256 + 256) x 2 =
    # 24,576; 36 gated-delta-net layers of 4 x (3 x (4096 + 2 x 16 x 128) + 128 x 4096) =
    # 4 x 548,864 = 2,195,456 B each -> 79,036,416.
    Case(
        "Qwen3-Next-80B-A3B-Instruct",
        fixture("Qwen3-Next-80B-A3B-Instruct"),
        Expect({FULL: 12, RECURRENT: 36}, 16, 2, 256, 256, 24_576, 262_144, state_bytes=79_036_416),
        QWEN3_NEXT,
    ),
    # MHA: 40 x 64 x (128 + 128) x 2 = 1,310,720 (8192 / 64 = 128).
    Case(
        "c4ai-command-r-v01_ollama-convert",
        fixture("c4ai-command-r-v01_ollama-convert"),
        Expect({FULL: 40}, 64, 64, 128, 128, 1_310_720, 131_072),
    ),
    # Mamba: no KV; 64 x 4 x (3 x 8192 + 16 x 8192) = 64 x 622,592 = 39,845,888 (hf/INDEX:
    # 9,961,472 f32 elements); context 2^20 is the converter's placeholder.
    Case(
        "falcon-mamba-7b-Q4_K_S",
        fixture("falcon-mamba-7b-Q4_K_S"),
        Expect({RECURRENT: 64}, 0, 0, 0, 0, 0, 0, state_bytes=39_845_888, note="placeholder"),
        FALCON_MAMBA,
    ),
    # gemma2 pattern 2: odd layers global: 23 x 16 x (128 + 128) x 2 = 188,416; 23 sliding x
    # 4096 x 16 x 256 x 2 = 771,751,936.
    Case(
        "gemma-2-27b-it-Q8_0",
        fixture("gemma-2-27b-it-Q8_0"),
        Expect({FULL: 23, SLIDING: 23}, 32, 16, 128, 128, 188_416, 8192, 771_751_936, 4096),
    ),
    # 21 x 8 x (256 + 256) x 2 = 172,032 (key_length 256, not 3584 / 16 = 224); 21 x 4096 x 8
    # x 512 x 2 = 704,643,072.
    Case(
        "gemma-2-9b-it",
        fixture("gemma-2-9b-it"),
        Expect({FULL: 21, SLIDING: 21}, 16, 8, 256, 256, 172_032, 8192, 704_643_072, 4096),
    ),
    # gpt-oss pattern 2 (no pattern key): 12 x 8 x (64 + 64) x 2 = 24,576 (half the 49,152 of
    # gguf-parser-go#32); 12 x 128 x 8 x 128 x 2 = 3,145,728.
    Case(
        "gpt-oss-20b",
        fixture("gpt-oss-20b"),
        Expect({FULL: 12, SLIDING: 12}, 64, 8, 64, 64, 24_576, 131_072, 3_145_728, 128),
        GPT_OSS,
    ),
    # Same geometry as the ollama conversion: 1,310,720.
    Case(
        "vocabonly__command-r__c4ai-command-r-v01",
        fixture("vocabonly__command-r__c4ai-command-r-v01"),
        Expect({FULL: 40}, 64, 64, 128, 128, 1_310_720, 131_072),
    ),
    # gemma4: bool-array pattern (every 6th global), per-layer KV heads (8 sliding, 2 global),
    # 512-wide global heads, 256-wide sliding heads: 5 x 2 x (512 + 512) x 2 = 20,480; 25 x
    # 1024 x 8 x (256 + 256) x 2 = 209,715,200. The first KV layer slides, so head dims 256.
    Case(
        "vocabonly__gemma-4__gemma4-moe",
        fixture("vocabonly__gemma-4__gemma4-moe"),
        Expect({FULL: 5, SLIDING: 25}, 16, 8, 256, 256, 20_480, 262_144, 209_715_200, 1024),
    ),
    # Llama-3-8B: 131,072 B/token, 8192 context.
    Case(
        "vocabonly__llama-bpe__Meta-Llama-3-8B",
        fixture("vocabonly__llama-bpe__Meta-Llama-3-8B"),
        Expect({FULL: 32}, 32, 8, 128, 128, 131_072, 8192),
    ),
    # Phi-3-mini: 32 x 32 x (96 + 96) x 2 = 393,216 (gt-013: 4096 cells -> 1536 MiB).
    Case(
        "vocabonly__phi-3__Phi-3-mini-4k-instruct",
        fixture("vocabonly__phi-3__Phi-3-mini-4k-instruct"),
        Expect({FULL: 32}, 32, 32, 96, 96, 393_216, 4096),
    ),
    # Qwen1.5-7B shape: MHA 32 x 32 x 256 x 2 = 524,288.
    Case(
        "vocabonly__qwen2__Qwen1.5-7B-shape",
        fixture("vocabonly__qwen2__Qwen1.5-7B-shape"),
        Expect({FULL: 32}, 32, 32, 128, 128, 524_288, 32_768),
    ),
]

GEMMA2_9B = fixture("gemma-2-9b-it")
GEMMA4 = fixture("vocabonly__gemma-4__gemma4-moe")
V3_NEW_MD = _with(fixture("DeepSeek-V3_new-MLA-format"), V3_NEW)
QWEN3_NEXT_MD = _with(fixture("Qwen3-Next-80B-A3B-Instruct"), QWEN3_NEXT)
GEMMA3_4B = geometry(
    "gemma3",
    {
        "block_count": 34,
        "context_length": 131072,
        "embedding_length": 2560,
        "attention.head_count": 8,
        "attention.head_count_kv": 4,
        "attention.key_length": 256,
        "attention.value_length": 256,
        "attention.sliding_window": 1024,
    },
)
LLAMA4_SCOUT = geometry(
    "llama4",
    {
        "block_count": 48,
        "context_length": 10485760,
        "embedding_length": 5120,
        "attention.head_count": 40,
        "attention.head_count_kv": 8,
        "attention.key_length": 128,
        "attention.value_length": 128,
    },
)
LFM2_1B = geometry(
    "lfm2",
    {
        "block_count": 16,
        "context_length": 128000,
        "embedding_length": 2048,
        "attention.head_count": 32,
        # HF config full_attn_idxs [2, 5, 8, 10, 12, 14]; the converter writes 0 KV heads for
        # the short-convolution layers.
        "attention.head_count_kv": [0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0],
        "shortconv.l_cache": 3,
    },
)
EXAONE4 = {
    "context_length": 65536,
    "attention.head_count_kv": 8,
}

RULE_CASES = [
    # gemma-3-4b (gt-017: 5 global + 29 local layers): pattern 6 -> layers 5, 11, ..., 29
    # global: 5 x 4 x 512 x 2 = 20,480 (gt-017: 8192 cells -> 160 MiB); 29 x 1024 x 4 x 512
    # x 2 = 121,634,816.
    Case(
        "gemma3-pattern-6",
        GEMMA3_4B,
        Expect({FULL: 5, SLIDING: 29}, 8, 4, 256, 256, 20_480, 131_072, 121_634_816, 1024),
    ),
    # gemma3 without a window: no SWA at all: 34 x 4 x 512 x 2 = 139,264.
    Case(
        "gemma3-no-window",
        {k: v for k, v in GEMMA3_4B.items() if k != "gemma3.attention.sliding_window"},
        Expect({FULL: 34}, 8, 4, 256, 256, 139_264, 131_072),
    ),
    # gemma-3n-E2B: pattern 5 over the first 20 layers (4 global, 16 local), layers 20-29
    # reuse earlier KV: 4 x 2 x 512 x 2 = 8,192; 16 x 512 x 2 x 512 x 2 = 16,777,216.
    Case(
        "gemma3n-shared-tail",
        geometry(
            "gemma3n",
            {
                "block_count": 30,
                "context_length": 32768,
                "embedding_length": 2048,
                "attention.head_count": 8,
                "attention.head_count_kv": 2,
                "attention.key_length": 256,
                "attention.value_length": 256,
                "attention.sliding_window": 512,
            },
        ),
        Expect({FULL: 4, SLIDING: 16, NO_CACHE: 10}, 8, 2, 256, 256, 8192, 32768, 16_777_216, 512),
    ),
    # gemma4 with 10 shared layers: layers 0-19 keep KV (globals 5, 11, 17): 3 x 2 x 1024 x 2
    # = 12,288; 17 x 1024 x 8 x 512 x 2 = 142,606,336.
    Case(
        "gemma4-shared-kv",
        _with(GEMMA4, {"gemma4.attention.shared_kv_layers": 10}),
        Expect(
            {FULL: 3, SLIDING: 17, NO_CACHE: 10},
            16,
            8,
            256,
            256,
            12_288,
            262_144,
            142_606_336,
            1024,
        ),
    ),
    # Llama 4 Scout: chunked 8192 on 3 of 4 layers: 12 x 8 x 256 x 2 = 49,152; 36 x 8192 x 8 x
    # 256 x 2 = 1,207,959,552.
    Case(
        "llama4-chunked",
        LLAMA4_SCOUT,
        Expect(
            {FULL: 12, SLIDING: 36},
            40,
            8,
            128,
            128,
            49_152,
            10_485_760,
            1_207_959_552,
            8192,
            note="chunked",
        ),
    ),
    # sliding_window = 0 turns chunking off: 48 x 8 x 256 x 2 = 196,608.
    Case(
        "llama4-window-0",
        _with(LLAMA4_SCOUT, {"llama4.attention.sliding_window": 0}),
        Expect({FULL: 48}, 40, 8, 128, 128, 196_608, 10_485_760),
    ),
    # Command R7B: pattern 4: 8 x 8 x 256 x 2 = 32,768; 24 x 4096 x 8 x 256 x 2 = 402,653,184.
    Case(
        "cohere2-pattern-4",
        geometry(
            "cohere2",
            {
                "block_count": 32,
                "context_length": 131072,
                "embedding_length": 4096,
                "attention.head_count": 32,
                "attention.head_count_kv": 8,
                "attention.sliding_window": 4096,
            },
        ),
        Expect({FULL: 8, SLIDING: 24}, 32, 8, 128, 128, 32_768, 131_072, 402_653_184, 4096),
    ),
    # Phi-3 files may carry sliding_window 2047; llama.cpp disables Phi SWA: 393,216 as above.
    Case(
        "phi3-window-ignored",
        _with(
            fixture("vocabonly__phi-3__Phi-3-mini-4k-instruct"),
            {"phi3.attention.sliding_window": 2047},
        ),
        Expect({FULL: 32}, 32, 32, 96, 96, 393_216, 4096, note="disables Phi SWA"),
    ),
    # An integer pattern overrides gemma2's 2: every 3rd layer global -> 14 global x 8 x 512 x
    # 2 = 114,688; 28 x 4096 x 8 x 512 x 2 = 939,524,096.
    Case(
        "pattern-int-override",
        _with(GEMMA2_9B, {"gemma2.attention.sliding_window_pattern": 3}),
        Expect({FULL: 14, SLIDING: 28}, 16, 8, 256, 256, 114_688, 8192, 939_524_096, 4096),
    ),
    # A bool array overrides it too: all false -> 42 x 8 x 512 x 2 = 344,064.
    Case(
        "pattern-array-override",
        _with(GEMMA2_9B, {"gemma2.attention.sliding_window_pattern": [False] * 42}),
        Expect({FULL: 42}, 16, 8, 256, 256, 344_064, 8192),
    ),
    # Qwen2.5 files carry sliding_window 131072; llama.cpp ignores it: 57,344 unchanged.
    Case(
        "qwen2-window-ignored",
        _with(fixture("DeepSeek-R1-Distill-Qwen-7B"), {"qwen2.attention.sliding_window": 131072}),
        Expect({FULL: 28}, 28, 4, 128, 128, 57_344, 131_072, note="ignored"),
    ),
    # Jamba 1.5 Mini: attention at 4, 12, 20, 28 (offset 4, period 8): 4 x 8 x 256 x 2 =
    # 16,384; 28 Mamba layers x 4 x (3 x 8192 + 16 x 8192) = 28 x 622,592 = 17,432,576.
    Case(
        "jamba-kv-zero-layers",
        geometry(
            "jamba",
            {
                "block_count": 32,
                "context_length": 262144,
                "embedding_length": 4096,
                "attention.head_count": 32,
                "attention.head_count_kv": [8 if il % 8 == 4 else 0 for il in range(32)],
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 8192,
                "ssm.state_size": 16,
                "ssm.time_step_rank": 256,
            },
        ),
        Expect({FULL: 4, RECURRENT: 28}, 32, 8, 128, 128, 16_384, 262_144, state_bytes=17_432_576),
    ),
    # Granite 4.0-H-like (synthetic sizes), rope-less so context is the 2^20 placeholder:
    # attention at 3 and 7: 2 x 4 x 256 x 2 = 4,096; 6 Mamba2 layers x 4 x (3 x (3072 + 2 x 1
    # x 128) + 128 x 3072) = 6 x 1,612,800 = 9,676,800.
    Case(
        "granitehybrid",
        geometry(
            "granitehybrid",
            {
                "block_count": 8,
                "context_length": 1 << 20,
                "embedding_length": 1536,
                "attention.head_count": 12,
                "attention.head_count_kv": [0, 0, 0, 4, 0, 0, 0, 4],
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 3072,
                "ssm.state_size": 128,
                "ssm.group_count": 1,
            },
        ),
        Expect(
            {FULL: 2, RECURRENT: 6},
            12,
            4,
            128,
            128,
            4096,
            0,
            state_bytes=9_676_800,
            note="placeholder",
        ),
    ),
    # Nemotron-H (synthetic): M, MLP, attention, M, MLP, M. MLP-only blocks keep nothing:
    # 1 x 8 x 256 x 2 = 4,096; 3 x 4 x (3 x (2048 + 2 x 8 x 128) + 128 x 2048) = 3 x 1,097,728
    # = 3,293,184.
    Case(
        "nemotron_h-ffn-rule",
        geometry(
            "nemotron_h",
            {
                "block_count": 6,
                "context_length": 8192,
                "embedding_length": 1024,
                "attention.head_count": 8,
                "attention.head_count_kv": [0, 0, 8, 0, 0, 0],
                "feed_forward_length": [0, 4096, 0, 0, 4096, 0],
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 2048,
                "ssm.state_size": 128,
                "ssm.group_count": 8,
            },
        ),
        Expect(
            {RECURRENT: 3, NO_CACHE: 2, FULL: 1},
            8,
            8,
            128,
            128,
            4096,
            8192,
            state_bytes=3_293_184,
        ),
    ),
    # An explicit recurrent_layers array wins over the interval: 2 attention x 2 x 512 x 2 =
    # 4,096; 6 x 2,195,456 = 13,172,736.
    Case(
        "qwen3next-recurrent-layers",
        _with(
            QWEN3_NEXT_MD,
            {
                "qwen3next.block_count": 8,
                "qwen3next.attention.recurrent_layers": [
                    True,
                    True,
                    False,
                    True,
                    True,
                    True,
                    False,
                    True,
                ],
            },
        ),
        Expect({FULL: 2, RECURRENT: 6}, 16, 2, 256, 256, 4096, 262_144, state_bytes=13_172_736),
    ),
    # Falcon-H1 (synthetic sizes): every layer has attention and Mamba2: 4 x 2 x 256 x 2 =
    # 4,096 B/token and 4 x 4 x (3 x (1536 + 2 x 1 x 128) + 128 x 1536) = 4 x 807,936 =
    # 3,231,744.
    Case(
        "falcon-h1-parallel",
        geometry(
            "falcon-h1",
            {
                "block_count": 4,
                "context_length": 16384,
                "embedding_length": 1024,
                "attention.head_count": 8,
                "attention.head_count_kv": 2,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 1536,
                "ssm.state_size": 128,
                "ssm.group_count": 1,
            },
        ),
        Expect({FULL: 4}, 8, 2, 128, 128, 4096, 16384, state_bytes=3_231_744),
    ),
    # RWKV-7 1.5B-like: 24 x 4 x (2 x 2048 + 2048 x 64) = 24 x 540,672 = 12,976,128; the
    # converter's 1048576 context is a placeholder.
    Case(
        "rwkv7",
        geometry(
            "rwkv7",
            {
                "block_count": 24,
                "context_length": 1048576,
                "embedding_length": 2048,
                "wkv.head_size": 64,
            },
        ),
        Expect({RECURRENT: 24}, 0, 0, 0, 0, 0, 0, state_bytes=12_976_128, note="placeholder"),
    ),
    # RWKV6-Qwen2 writes token_shift_count 1: 28 x 4 x (3584 + 3584 x 128) = 28 x 1,849,344 =
    # 51,781,632.
    Case(
        "rwkv6qwen2-token-shift",
        geometry(
            "rwkv6qwen2",
            {
                "block_count": 28,
                "context_length": 32768,
                "embedding_length": 3584,
                "attention.head_count": 28,
                "attention.head_count_kv": 4,
                "wkv.head_size": 128,
                "token_shift_count": 1,
            },
        ),
        Expect({RECURRENT: 28}, 0, 0, 0, 0, 0, 32768, state_bytes=51_781_632),
    ),
    # LFM2-1.2B-like: 6 attention layers x 8 x 128 x 2 = 12,288; 10 short-conv layers x 4 x
    # 2048 x (3 - 1) = 10 x 16,384 = 163,840.
    Case(
        "lfm2-shortconv",
        LFM2_1B,
        Expect({FULL: 6, RECURRENT: 10}, 32, 8, 64, 64, 12_288, 128_000, state_bytes=163_840),
    ),
    # With a window every attention layer slides: 0 B/token; 6 x 512 x 8 x 128 x 2 =
    # 6,291,456.
    Case(
        "lfm2-swa",
        _with(LFM2_1B, {"lfm2.attention.sliding_window": 512}),
        Expect(
            {SLIDING: 6, RECURRENT: 10},
            32,
            8,
            64,
            64,
            0,
            128_000,
            6_291_456,
            512,
            state_bytes=163_840,
        ),
    ),
    # An MTP block counted in block_count keeps no cache in the main context: 70,272.
    Case(
        "deepseek2-mtp-tail",
        _with(V3_NEW_MD, {"deepseek2.block_count": 62, "deepseek2.nextn_predict_layers": 1}),
        Expect(
            {MLA: 61, NO_CACHE: 1},
            128,
            128,
            576,
            0,
            70_272,
            163_840,
            mla_expanded=(192, 128),
            note="MTP",
        ),
    ),
    # EXAONE 4.0 1.2B (30 layers) has no SWA in llama.cpp: 30 x 8 x 128 x 2 = 61,440.
    Case(
        "exaone4-30-layers",
        geometry(
            "exaone4",
            {
                **EXAONE4,
                "block_count": 30,
                "embedding_length": 2048,
                "attention.head_count": 32,
                "attention.sliding_window": 4096,
            },
        ),
        Expect({FULL: 30}, 32, 8, 64, 64, 61_440, 65536),
    ),
    # EXAONE 4.0 32B (64 layers): pattern 4, window 4096 by default: 16 x 8 x 256 x 2 = 65,536;
    # 48 x 4096 x 8 x 256 x 2 = 805,306,368.
    Case(
        "exaone4-64-layers",
        geometry(
            "exaone4",
            {
                **EXAONE4,
                "block_count": 64,
                "embedding_length": 5120,
                "attention.head_count": 40,
            },
        ),
        Expect({FULL: 16, SLIDING: 48}, 40, 8, 128, 128, 65_536, 65536, 805_306_368, 4096),
    ),
    # smallthinker: dense-first pattern 4 (layers 0 and 4 full) and a window forced to 4096
    # whatever the file says: 2 x 4 x 128 x 2 = 2,048; 6 x 4096 x 4 x 128 x 2 = 25,165,824.
    Case(
        "smallthinker-dense-first",
        geometry(
            "smallthinker",
            {
                "block_count": 8,
                "context_length": 32768,
                "embedding_length": 256,
                "attention.head_count": 4,
                "attention.head_count_kv": 4,
                "attention.sliding_window": 1,
            },
        ),
        Expect({FULL: 2, SLIDING: 6}, 4, 4, 64, 64, 2048, 32768, 25_165_824, 4096),
    ),
    # Mamba-Codestral-like mamba2: 64 x 4 x (3 x (8192 + 2 x 8 x 128) + 128 x 8192) = 64 x
    # 4,317,184 = 276,299,776.
    Case(
        "mamba2-groups",
        geometry(
            "mamba2",
            {
                "block_count": 64,
                "context_length": 1 << 20,
                "embedding_length": 4096,
                "attention.head_count": 0,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 8192,
                "ssm.state_size": 128,
                "ssm.group_count": 8,
                "ssm.time_step_rank": 128,
            },
        ),
        Expect({RECURRENT: 64}, 0, 0, 0, 0, 0, 0, state_bytes=276_299_776, note="placeholder"),
    ),
]


@pytest.mark.parametrize("case", FIXTURE_CASES + RULE_CASES, ids=lambda c: c.id)
def test_shape_matches_llama_cpp(case: Case) -> None:
    """Each header yields llama.cpp's layer kinds, heads, head sizes and cache bytes."""
    shape = shape_from_gguf(_with(case.metadata, case.completion))
    e = case.expect
    assert Counter(la.kind for la in shape.layers) == Counter(e.kinds)
    assert shape.block_count == sum(e.kinds.values())
    assert (shape.attention_heads, shape.kv_heads) == (e.attention_heads, e.kv_heads)
    assert (shape.head_dim_k, shape.head_dim_v) == (e.head_dim_k, e.head_dim_v)
    assert shape.kv_bytes_per_token() == e.kv_bytes_per_token
    assert shape.kv_bytes_fixed() == e.kv_bytes_fixed
    assert shape.sliding_window == e.sliding_window
    assert shape.state_bytes_per_sequence() == e.state_bytes
    assert shape.trained_context == e.trained_context
    assert shape.mla_expanded == e.mla_expanded
    assert shape.format == "gguf"
    assert shape.kv_dtype_bytes == 2
    if e.note:
        assert any(e.note in n for n in shape.notes), shape.notes
    else:
        assert shape.notes == ()


def _layers(shape: ModelShape, kind: LayerKind) -> list[int]:
    return [il for il, la in enumerate(shape.layers) if la.kind is kind]


@pytest.mark.parametrize(
    ("metadata", "kind", "expected"),
    [
        # gemma2 pattern 2: the last of each pair is global.
        (GEMMA2_9B, FULL, list(range(1, 42, 2))),
        # gpt-oss: layer 0 slides, as HF's layer_types says.
        (_with(fixture("gpt-oss-20b"), GPT_OSS), SLIDING, list(range(0, 24, 2))),
        # Qwen3-Next: (il + 1) % 4 == 0 attends.
        (_with(fixture("Qwen3-Next-80B-A3B-Instruct"), QWEN3_NEXT), FULL, list(range(3, 48, 4))),
        # gemma4: exactly where the bool array says false.
        (GEMMA4, FULL, [5, 11, 17, 23, 29]),
        # smallthinker dense-first: the first of each group of 4.
        (next(c.metadata for c in RULE_CASES if c.id == "smallthinker-dense-first"), FULL, [0, 4]),
    ],
    ids=["gemma2", "gpt-oss", "qwen3next", "gemma4", "smallthinker"],
)
def test_which_layers(metadata: dict[str, object], kind: LayerKind, expected: list[int]) -> None:
    """The layers of a kind sit where llama.cpp puts them, not just in the right number."""
    assert _layers(shape_from_gguf(metadata), kind) == expected


def test_gemma4_global_layers_use_their_own_head_size() -> None:
    """gemma4's global layers keep 2 heads of 512 while its sliding layers keep 8 of 256."""
    shape = shape_from_gguf(GEMMA4)
    assert {
        (la.kv_heads, la.head_dim_k, la.head_dim_v) for la in shape.layers if la.kind is FULL
    } == {(2, 512, 512)}
    assert {
        (la.kv_heads, la.head_dim_k, la.head_dim_v) for la in shape.layers if la.kind is SLIDING
    } == {(8, 256, 256)}


@pytest.mark.parametrize(
    ("file_bytes", "tensor_bytes", "weights"),
    [(0, 0, 0), (5_000_000_000, 0, 5_000_000_000), (5_000_000_000, 4_920_000_000, 4_920_000_000)],
)
def test_weights_prefer_tensor_bytes(file_bytes: int, tensor_bytes: int, weights: int) -> None:
    """Weights are the tensors' bytes when known, else the file's size, else 0."""
    shape = shape_from_gguf(GEMMA2_9B, file_bytes=file_bytes, tensor_bytes=tensor_bytes)
    assert shape.weights_bytes == weights


LLAMA = fixture("Meta-Llama-3.1-8B-Instruct-Q4_K_M")


def _without(md: dict[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in md.items() if k != key}


MALFORMED = [
    ("no-architecture", _without(LLAMA, "general.architecture"), "general.architecture"),
    ("architecture-not-string", _with(LLAMA, {"general.architecture": 7}), "architecture"),
    ("no-block-count", _without(LLAMA, "llama.block_count"), "llama.block_count"),
    ("block-count-zero", _with(LLAMA, {"llama.block_count": 0}), "llama.block_count"),
    ("block-count-negative", _with(LLAMA, {"llama.block_count": -32}), "llama.block_count"),
    ("block-count-absurd", _with(LLAMA, {"llama.block_count": 1 << 40}), "llama.block_count"),
    ("block-count-string", _with(LLAMA, {"llama.block_count": "32"}), "not a whole number"),
    ("block-count-float", _with(LLAMA, {"llama.block_count": 32.0}), "not a whole number"),
    ("block-count-bool", _with(LLAMA, {"llama.block_count": True}), "not a whole number"),
    ("no-context", _without(LLAMA, "llama.context_length"), "llama.context_length"),
    ("no-embedding", _without(LLAMA, "llama.embedding_length"), "llama.embedding_length"),
    ("heads-absurd", _with(LLAMA, {"llama.attention.head_count": 1 << 40}), "head_count"),
    (
        "kv-array-short",
        _with(LLAMA, {"llama.attention.head_count_kv": [8] * 31}),
        "31 entries but the model has 32",
    ),
    (
        "kv-array-negative",
        _with(LLAMA, {"llama.attention.head_count_kv": [8] * 31 + [-8]}),
        "head_count_kv",
    ),
    ("key-length-absurd", _with(LLAMA, {"llama.attention.key_length": 1 << 31}), "key_length"),
    # DeepSeek-V2-Lite as transcribed lacks its head counts: nothing would hold its context.
    ("no-heads", fixture("DeepSeek-V2-Lite-Chat"), "no attention heads"),
    # The transcribed dumps that do not show block_count are refused for it.
    ("gpt-oss-as-transcribed", fixture("gpt-oss-20b"), "gpt-oss.block_count"),
    ("v3-new-as-transcribed", fixture("DeepSeek-V3_new-MLA-format"), "deepseek2.block_count"),
    ("falcon-mamba-as-transcribed", fixture("falcon-mamba-7b-Q4_K_S"), "mamba.block_count"),
    (
        "gemma4-without-pattern",
        _without(GEMMA4, "gemma4.attention.sliding_window_pattern"),
        "sliding_window_pattern",
    ),
    (
        "gemma4-pattern-int",
        _with(GEMMA4, {"gemma4.attention.sliding_window_pattern": 6}),
        "one boolean per layer",
    ),
    (
        "pattern-array-wrong-length",
        _with(GEMMA2_9B, {"gemma2.attention.sliding_window_pattern": [True] * 41}),
        "list of 42 booleans",
    ),
    (
        "pattern-array-not-bool",
        _with(GEMMA2_9B, {"gemma2.attention.sliding_window_pattern": ["yes"] * 42}),
        "not a boolean",
    ),
    (
        "gemma4-all-layers-shared",
        _with(GEMMA4, {"gemma4.attention.shared_kv_layers": 29}),
        "at least 2 layers",
    ),
    (
        "gpt-oss-window-zero",
        _with(_with(fixture("gpt-oss-20b"), GPT_OSS), {"gpt-oss.attention.sliding_window": 0}),
        "sliding_window is 0",
    ),
    (
        "mla-half-declared",
        _without(V3_NEW_MD, "deepseek2.attention.value_length_mla"),
        "both be set",
    ),
    (
        "mamba-without-ssm",
        _without(_with(fixture("falcon-mamba-7b-Q4_K_S"), FALCON_MAMBA), "mamba.ssm.conv_kernel"),
        "mamba.ssm.conv_kernel",
    ),
    (
        "unsupported-hybrid",
        _with(LLAMA, {"general.architecture": "kimi-linear"}),
        "does not model",
    ),
]


@pytest.mark.parametrize(
    ("metadata", "fragment"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_metadata_is_refused(metadata: dict[str, object], fragment: str) -> None:
    """A header missing what llama.cpp needs, or with absurd values, is refused by name."""
    with pytest.raises(InvalidShape) as err:
        shape_from_gguf(metadata, source="https://example.invalid/x.gguf")
    assert fragment in err.value.message
    assert err.value.source == "https://example.invalid/x.gguf"
    assert err.value.message.endswith(".")


def test_negative_sizes_are_refused() -> None:
    """Negative file or tensor sizes are refused rather than turned into negative weights."""
    with pytest.raises(InvalidShape):
        shape_from_gguf(LLAMA, file_bytes=-1)


def test_widths_for_the_activation_estimates_are_read() -> None:
    """A GGUF's embedding and FFN widths and vocabulary become the shape's compute widths; a
    mixture of experts also gets its expert counts and widths (Mixtral's expert width is its
    feed_forward_length), and a tokenizer list the reader summarised gives the vocabulary."""
    llama = shape_from_gguf(fixture("Meta-Llama-3.1-8B-Instruct-Q4_K_M"))
    assert llama.compute == Compute(4096, 14336, 128256)
    mixtral = geometry(
        "llama",
        {
            "block_count": 32,
            "context_length": 32768,
            "embedding_length": 4096,
            "feed_forward_length": 14336,
            "attention.head_count": 32,
            "attention.head_count_kv": 8,
            "expert_count": 8,
            "expert_used_count": 2,
            "tokenizer.ggml.tokens": ArraySummary(GGUFValueType.STRING, 32000),
        },
    )
    assert shape_from_gguf(mixtral).compute == Compute(4096, 14336, 32000, 8, 2, 14336)
    lite = geometry(
        "deepseek2",
        {
            "block_count": 27,
            "context_length": 163840,
            "embedding_length": 2048,
            "feed_forward_length": 10944,
            "attention.head_count": 16,
            "attention.head_count_kv": 1,
            "attention.key_length": 576,
            "attention.value_length": 512,
            "attention.key_length_mla": 192,
            "attention.value_length_mla": 128,
            "expert_count": 64,
            "expert_used_count": 6,
            "expert_feed_forward_length": 1408,
            "expert_shared_count": 2,
            "leading_dense_block_count": 1,
            "vocab_size": 102400,
        },
    )
    assert shape_from_gguf(lite).compute == Compute(2048, 10944, 102400, 64, 6, 1408, 2816, 1)
