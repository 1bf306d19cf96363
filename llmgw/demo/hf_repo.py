"""The demo's Hugging Face-shaped repo: a small Llama's config.json and one safetensors file
with a real header over sparse (zero) tensor data.

The file is never written: `SparseFile` makes its bytes on demand, so a repo of a
billion-parameter model costs a few kilobytes. The planner reads the config through
`huggingface_hub` and the weights' size from the safetensors header, as it would from the Hub.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REPO = "llmgw-demo/tiny-llama"
WEIGHTS_FILE = "model.safetensors"

# Bytes of one element of each safetensors dtype the demo uses (the format's own table).
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


@dataclass(frozen=True)
class SparseFile:
    """A file made of `head` followed by zeros up to `size` bytes, generated when read."""

    head: bytes
    size: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file (clamped to its size)."""
        end = min(end, self.size)
        if start >= end:
            return b""
        head = self.head[start:end]
        return head + bytes(end - start - len(head))


Content = bytes | SparseFile


def content_size(content: Content) -> int:
    """A file's size in bytes."""
    return content.size if isinstance(content, SparseFile) else len(content)


def read_content(content: Content, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file."""
    if isinstance(content, SparseFile):
        return content.read(start, end)
    return content[start:end]


def safetensors_file(tensors: Mapping[str, tuple[str, Sequence[int]]]) -> SparseFile:
    """A safetensors file for `tensors` ({name: (dtype, shape)}): the 8-byte little-endian
    header length, the JSON header padded with spaces to 8 bytes (as the format's writer
    pads it), then each tensor's bytes at its `data_offsets`, all zeros."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        size = count * DTYPE_BYTES[dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return SparseFile(head=head, size=len(head) + offset)


@dataclass(frozen=True)
class LlamaConfig:
    """The demo model's geometry: a 16-layer Llama with 32 attention heads over 8 KV heads
    (tensor parallel 1, 2, 4 or 8 splits them; 3 does not), trained for 32k tokens."""

    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 5632
    vocab: int = 32000
    context_tokens: int = 32768
    dtype: str = "BF16"

    def config_json(self) -> dict[str, Any]:
        """config.json as transformers writes it for a Llama."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.hidden // self.heads,
            "max_position_embeddings": self.context_tokens,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16" if self.dtype == "BF16" else "float16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }

    def tensors(self) -> dict[str, tuple[str, list[int]]]:
        """Every tensor of the model, named as transformers names a Llama's."""
        h, kv_dim, d = self.hidden, self.kv_heads * (self.hidden // self.heads), self.dtype
        out: dict[str, tuple[str, list[int]]] = {
            "model.embed_tokens.weight": (d, [self.vocab, h]),
            "model.norm.weight": (d, [h]),
            "lm_head.weight": (d, [self.vocab, h]),
        }
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out |= {
                f"{p}.input_layernorm.weight": (d, [h]),
                f"{p}.self_attn.q_proj.weight": (d, [h, h]),
                f"{p}.self_attn.k_proj.weight": (d, [kv_dim, h]),
                f"{p}.self_attn.v_proj.weight": (d, [kv_dim, h]),
                f"{p}.self_attn.o_proj.weight": (d, [h, h]),
                f"{p}.post_attention_layernorm.weight": (d, [h]),
                f"{p}.mlp.gate_proj.weight": (d, [self.intermediate, h]),
                f"{p}.mlp.up_proj.weight": (d, [self.intermediate, h]),
                f"{p}.mlp.down_proj.weight": (d, [h, self.intermediate]),
            }
        return out


def demo_repo(config: LlamaConfig | None = None) -> dict[str, Content]:
    """The repo's files: config.json, generation_config.json and model.safetensors."""
    c = config or LlamaConfig()
    return {
        "config.json": json.dumps(c.config_json(), indent=2).encode(),
        "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}).encode(),
        WEIGHTS_FILE: safetensors_file(c.tensors()),
    }
