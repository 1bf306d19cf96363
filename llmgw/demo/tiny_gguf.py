"""A tiny llama-architecture GGUF model that llama.cpp loads and answers with.

The weights are random (seeded, so the file is the same on every machine) and the vocabulary
is a minimal SentencePiece one: the control tokens, the 256 byte tokens SentencePiece falls
back to (so any text tokenizes) and a few letters and words, which are all it answers with.
It answers nonsense, quickly: it proves the path from the catalog to a real engine, not a
model's quality.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "llama"


@dataclass(frozen=True)
class TinyLlama:
    """The tiny model's geometry."""

    layers: int = 2
    n_embd: int = 64
    heads: int = 4
    kv_heads: int = 2
    n_ff: int = 128
    context_tokens: int = 32768
    """What it claims it was trained for: long enough for the demo's context changes."""
    seed: int = 20240601

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.n_embd // self.heads


_WORDS = ("▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁llm", "▁gateway", "▁hello")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """The tokens, their scores and their types: unk, bos, eos, 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", *_WORDS]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SentencePiece prefers higher scores: longer pieces first, bytes last.
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(10 - min(len(p), 9)) for p in pieces]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: str | os.PathLike[str], geometry: TinyLlama | None = None) -> Path:
    """Write the tiny model to `path` (replacing it atomically) and return the path."""
    g = geometry or TinyLlama()
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(g.seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, ARCH)
    writer.add_name("llmgw demo tiny llama")
    writer.add_block_count(g.layers)
    writer.add_context_length(g.context_tokens)
    writer.add_embedding_length(g.n_embd)
    writer.add_feed_forward_length(g.n_ff)
    writer.add_head_count(g.heads)
    writer.add_head_count_kv(g.kv_heads)
    writer.add_rope_dimension_count(g.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    # numpy shapes are (rows, row length): the reverse of ggml's order.
    writer.add_tensor("token_embd.weight", weight(n_vocab, g.n_embd))
    writer.add_tensor("output_norm.weight", np.ones(g.n_embd, dtype=np.float32))
    # The output layer knows only the letter and word pieces (control and byte tokens get a
    # logit of 0, the pieces' largest is above it), so the model answers in readable words
    # rather than stray bytes that are not UTF-8.
    output = np.zeros((n_vocab, g.n_embd), dtype=np.float32)
    first_piece = tokens.index("▁")
    output[first_piece:] = (rng.standard_normal((n_vocab - first_piece, g.n_embd)) * 0.5).astype(
        np.float32
    )
    writer.add_tensor("output.weight", output)
    kv = g.kv_heads * g.head_dim
    for i in range(g.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(g.n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(g.n_embd, g.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, g.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, g.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(g.n_embd, g.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(g.n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(g.n_ff, g.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(g.n_ff, g.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(g.n_embd, g.n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, target)
    return target
