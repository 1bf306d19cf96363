"""The repos the Hugging Face-shaped server serves in tests: fixture configs from
tests/fixtures/hf (see PROVENANCE.md) with weights whose sizes are known.

Tests import the names from here; the pytest fixtures that start the server are in
tests/support/hf_fixtures.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.testing.content import Content, SparseFile, safetensors_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"

LLAMA_1B = "meta-llama/Llama-3.2-1B-Instruct"
"""One model.safetensors whose header lists the real model's 146 tensors (2,471,628,800 B)."""
LLAMA_1B_WEIGHTS_BYTES = 2 * 1_235_814_400

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
"""Sharded: model.safetensors.index.json and two shards totalling INDEX.md's total_size."""
QWEN_7B_WEIGHTS_BYTES = 15_231_233_024

DEEPSEEK_V2_LITE = "deepseek-ai/DeepSeek-V2-Lite"
"""PyTorch .bin shards only: the weights come from the repo's file sizes."""
DEEPSEEK_V2_LITE_WEIGHTS_BYTES = 16_000_000_000 + 15_400_000_000

FALCON_MAMBA = "tiiuae/falcon-mamba-7b"
"""config.json only: weights unknown."""

GATED = "meta-llama/Llama-3.1-8B-Instruct"
GATED_TOKEN = "hf_test_token_for_gated_repo"

NOT_JSON = "broken/not-json"
NOT_AN_OBJECT = "broken/not-an-object"
HUGE_CONFIG = "broken/huge-config"
NO_CONFIG = "broken/no-config"


def config_bytes(name: str) -> bytes:
    """A fixture config.json's bytes (tests/fixtures/hf/PROVENANCE.md)."""
    return (FIXTURES / f"{name}.json").read_bytes()


def llama_32_1b_tensors() -> dict[str, tuple[str, list[int]]]:
    """Llama-3.2-1B's tensors (names, BF16, shapes) as its config implies: 1,235,814,400
    parameters, tied embeddings (no lm_head)."""
    hidden, inter, kv, vocab = 2048, 8192, 512, 128256
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": ("BF16", [vocab, hidden]),
        "model.norm.weight": ("BF16", [hidden]),
    }
    for i in range(16):
        prefix = f"model.layers.{i}"
        tensors.update(
            {
                f"{prefix}.self_attn.q_proj.weight": ("BF16", [hidden, hidden]),
                f"{prefix}.self_attn.k_proj.weight": ("BF16", [kv, hidden]),
                f"{prefix}.self_attn.v_proj.weight": ("BF16", [kv, hidden]),
                f"{prefix}.self_attn.o_proj.weight": ("BF16", [hidden, hidden]),
                f"{prefix}.mlp.gate_proj.weight": ("BF16", [inter, hidden]),
                f"{prefix}.mlp.up_proj.weight": ("BF16", [inter, hidden]),
                f"{prefix}.mlp.down_proj.weight": ("BF16", [hidden, inter]),
                f"{prefix}.input_layernorm.weight": ("BF16", [hidden]),
                f"{prefix}.post_attention_layernorm.weight": ("BF16", [hidden]),
            }
        )
    return tensors


def qwen_7b_shards() -> dict[str, Content]:
    """Two shards and their index: embeddings and lm_head in one, the layers (gathered into one
    tensor, for brevity) in the other, summing to the real total_size."""
    embeddings = {
        "model.embed_tokens.weight": ("BF16", [152064, 3584]),
        "lm_head.weight": ("BF16", [152064, 3584]),
    }
    rest = (QWEN_7B_WEIGHTS_BYTES - 2 * 2 * 152064 * 3584) // 2
    layers = {"model.layers.all": ("BF16", [rest])}
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = {
        "metadata": {"total_size": QWEN_7B_WEIGHTS_BYTES},
        "weight_map": {**dict.fromkeys(embeddings, first), **dict.fromkeys(layers, second)},
    }
    return {
        "config.json": config_bytes("Qwen__Qwen2.5-7B-Instruct"),
        "model.safetensors.index.json": _json_bytes(index),
        first: safetensors_file(embeddings),
        second: safetensors_file(layers),
    }


def _json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()


def default_repos() -> dict[str, dict[str, Content]]:
    """The repos `hf_server` serves (see the module constants)."""
    return {
        LLAMA_1B: {
            "config.json": config_bytes("meta-llama__Llama-3.2-1B-Instruct"),
            "model.safetensors": safetensors_file(llama_32_1b_tensors(), metadata={"format": "pt"}),
            "README.md": b"# Llama 3.2 1B stand-in\n",
        },
        QWEN_7B: qwen_7b_shards(),
        DEEPSEEK_V2_LITE: {
            "config.json": config_bytes("deepseek-ai__DeepSeek-V2-Lite"),
            "pytorch_model-00001-of-00002.bin": SparseFile(b"", 16_000_000_000),
            "pytorch_model-00002-of-00002.bin": SparseFile(b"", 15_400_000_000),
        },
        FALCON_MAMBA: {"config.json": config_bytes("tiiuae__falcon-mamba-7b")},
        GATED: {"config.json": config_bytes("meta-llama__Llama-3.1-8B-Instruct")},
        NOT_JSON: {"config.json": b'{"model_type": "llama", "num_hidden_layers": 32,'},
        NOT_AN_OBJECT: {"config.json": b"[32, 32, 8]"},
        HUGE_CONFIG: {"config.json": b"{" + b" " * (4 << 20) + b"}"},
        NO_CONFIG: {"README.md": b"nothing here\n"},
    }
