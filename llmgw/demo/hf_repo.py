"""The demo's Hugging Face-shaped repo: a small Llama's config.json and one safetensors file
with a real header over sparse (zero) tensor data.

The file is never written: a `SparseFile` (llmgw.testing.content) makes its bytes on demand,
so a repo of a billion-parameter model costs a few kilobytes. The planner reads the config through
`huggingface_hub` and the weights' size from the safetensors header, as it would from the Hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmgw.testing.content import Content, safetensors_file

REPO = "llmgw-demo/tiny-llama"
WEIGHTS_FILE = "model.safetensors"


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
        WEIGHTS_FILE: safetensors_file(c.tensors(), metadata={"format": "pt"}),
    }
