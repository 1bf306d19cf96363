"""Small loadable GGUF models, one per cache geometry, for running the real llama.cpp on.

Each `Geometry` is written with every tensor its architecture's loader asks for (tensor names
and shapes from llama.cpp's `src/models/<arch>.cpp` `load_arch_tensors`, vendored in
llama-cpp-python 0.3.36), random small weights and a dummy vocabulary
(`tokenizer.ggml.model = "none"` with `{arch}.vocab_size`, src/llama-vocab.cpp:1949-1968), so
llama.cpp loads them in milliseconds. `inline_shape` is the same geometry as the planner's
`ModelShape`, built by hand from what llama.cpp derives (head sizes, sliding layers, MLA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from llmgw.shape import Layer, LayerKind, ModelShape

VOCAB = 32
"""Dummy vocabulary size: the cache does not depend on it."""


@dataclass(frozen=True)
class Mla:
    """DeepSeek-2 attention: low-rank Q and KV, a rope part and a no-rope part per head."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int
    legacy: bool = False
    """Written as older converters did (no key_length_mla): llama.cpp caches full heads."""
    indexer: int = 0
    """DeepSeek V3.2's sparse-attention indexer key width (deepseek32): 0 for none."""


@dataclass(frozen=True)
class Ssm:
    """Mamba state sizes (src/models/mamba.cpp and jamba.cpp need inner = 2 x embedding;
    `groups` > 0 writes a Mamba-2 mixer, src/models/mamba2.cpp, whose dt_rank is its heads)."""

    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int
    groups: int = 0

    def state_bytes(self) -> int:
        """One sequence's f32 state in one layer: conv (d_conv - 1) x (inner + 2 x groups x
        state) and ssm state x inner (src/llama-hparams.cpp n_embd_r / n_embd_s)."""
        conv = (self.d_conv - 1) * (self.d_inner + 2 * self.groups * self.d_state)
        return (conv + self.d_state * self.d_inner) * 4


@dataclass(frozen=True)
class Geometry:
    """One test model's numbers; `kv_heads` is a number or one entry per layer."""

    name: str
    arch: str
    layers: int
    n_embd: int
    heads: int
    kv_heads: int | tuple[int, ...]
    head_dim: int
    head_dim_v: int = 0
    """0: the same as `head_dim`."""
    n_ff: int | tuple[int, ...] = 64
    """The FFN width, or one per layer (nemotron_h: 0 on its Mamba and attention layers)."""
    context_length: int = 2048
    window: int = 0
    """Sliding window for gemma2/gemma3/gpt-oss."""
    experts: int = 0
    experts_used: int = 0
    mla: Mla | None = None
    ssm: Ssm | None = None
    shortconv: int = 0
    """LFM2's short-convolution cache length (its recurrent layers keep n_embd x (L - 1))."""
    extra_kv: dict[str, int] = field(default_factory=dict)

    @property
    def v_dim(self) -> int:
        """The value head size."""
        return self.head_dim_v or self.head_dim

    def kv_heads_of(self, il: int) -> int:
        """KV heads of layer `il`."""
        return self.kv_heads if isinstance(self.kv_heads, int) else self.kv_heads[il]

    def ff_of(self, il: int) -> int:
        """FFN width of layer `il`."""
        return self.n_ff if isinstance(self.n_ff, int) else self.n_ff[il]

    @property
    def hybrid(self) -> bool:
        """Attention layers beside recurrent ones (jamba, lfm2: the KV-less layers recur;
        nemotron_h: those that also have no FFN)."""
        return self.arch in ("jamba", "lfm2", "nemotron_h")

    def recurs(self, il: int) -> bool:
        """Whether layer `il` is recurrent (jamba.cpp, lfm2.cpp, nemotron-h.cpp is_recr)."""
        if not self.recurrent:
            return False
        if not self.hybrid:
            return True
        return self.kv_heads_of(il) == 0 and (self.arch != "nemotron_h" or self.ff_of(il) == 0)

    @property
    def recurrent(self) -> bool:
        """Whether the model keeps recurrent state."""
        return self.ssm is not None or self.shortconv > 0


# The grid's models. Head sizes 64/80/96/128/256 over GQA, MQA and MHA; 80 is the one a
# 32-element quantized block does not divide (with one KV head not even the K row is whole
# blocks; with two it is, but the heads are not).
GEOMETRIES: tuple[Geometry, ...] = (
    Geometry("llama-gqa-64", "llama", 3, 512, 8, 2, 64),
    Geometry("llama-mqa-80", "llama", 2, 320, 4, 1, 80),
    Geometry("llama-gqa-80", "llama", 2, 320, 4, 2, 80),
    Geometry("llama-mha-96", "llama", 2, 384, 4, 4, 96),
    Geometry("llama-gqa-128", "llama", 2, 512, 4, 2, 128),
    Geometry("llama-mqa-256", "llama", 2, 512, 2, 1, 256),
    Geometry("qwen2-gqa-64", "qwen2", 2, 256, 4, 2, 64),
    Geometry("qwen3-gqa-128", "qwen3", 3, 256, 8, 4, 128),
    Geometry("gemma2-swa-300", "gemma2", 4, 256, 4, 2, 128, window=300),
    Geometry("gemma3-swa-512", "gemma3", 7, 256, 4, 2, 256, window=512),
    Geometry("gpt-oss-swa-128", "gpt-oss", 4, 256, 4, 2, 64, window=128, experts=4,
             experts_used=2),
    Geometry("deci-per-layer-kv", "deci", 4, 256, 4, (2, 4, 0, 1), 64),
    Geometry("mamba-128", "mamba", 3, 128, 0, 0, 0, ssm=Ssm(4, 256, 16, 8)),
    Geometry("deepseek2-mla", "deepseek2", 2, 256, 4, 1, 0,
             mla=Mla(q_lora_rank=64, kv_lora_rank=128, qk_nope=32, qk_rope=32, v_head=32)),
    Geometry("deepseek2-legacy", "deepseek2", 2, 256, 4, 4, 0,
             mla=Mla(q_lora_rank=64, kv_lora_rank=128, qk_nope=32, qk_rope=32, v_head=32,
                     legacy=True)),
    # MLA with other ranks: a 64-wide latent and a 16-wide rope part, more heads.
    Geometry("deepseek2-mla-narrow", "deepseek2", 3, 256, 8, 1, 0,
             mla=Mla(q_lora_rank=32, kv_lora_rank=64, qk_nope=48, qk_rope=16, v_head=64)),
    # DeepSeek V3.2's sparse attention: the MLA latent plus an indexer key cache.
    Geometry("deepseek32-dsa", "deepseek32", 2, 256, 4, 1, 0,
             mla=Mla(q_lora_rank=64, kv_lora_rank=128, qk_nope=32, qk_rope=32, v_head=32,
                     indexer=64)),
    # Mamba-2 with groups (recurrent).
    Geometry("mamba2-groups", "mamba2", 2, 128, 0, 0, 0, ssm=Ssm(4, 256, 16, 8, groups=2)),
    # Hybrids: Mamba-1 and attention layers (jamba); short convolution and attention (lfm2),
    # with and without a sliding window (llama_memory_hybrid / llama_memory_hybrid_iswa).
    Geometry("jamba-hybrid", "jamba", 4, 128, 4, (0, 2, 0, 1), 32, ssm=Ssm(4, 256, 16, 8)),
    Geometry("lfm2-hybrid", "lfm2", 4, 128, 4, (0, 2, 0, 2), 32, shortconv=3),
    Geometry("lfm2-hybrid-swa", "lfm2", 5, 128, 4, (2, 0, 2, 0, 2), 32, window=96,
             shortconv=3),
    # Nemotron-H: Mamba-2 (no KV, no FFN), MLP-only (no KV, FFN) and attention (KV, no FFN).
    Geometry("nemotron-h-hybrid", "nemotron_h", 6, 128, 4, (0, 0, 2, 0, 0, 1), 32,
             n_ff=(0, 64, 0, 0, 64, 0), ssm=Ssm(4, 256, 16, 8, groups=2)),
)  # fmt: skip


def geometry(name: str) -> Geometry:
    """The grid's geometry called `name`."""
    return next(g for g in GEOMETRIES if g.name == name)


# ---------------------------------------------------------------------------------------------
# The planner's view: the shape llama.cpp derives from each header.


def inline_shape(g: Geometry) -> ModelShape:
    """The `ModelShape` llama.cpp sees in `g`, built by hand.

    Sliding layers follow each architecture's default pattern (src/llama-hparams.cpp
    set_swa_pattern: layer il slides when il % n < n - 1): gemma2 and gpt-oss n = 2, gemma3
    n = 6; lfm2 with a window slides on every attention layer. A hybrid's KV-less layers are
    its recurrent ones (jamba.cpp, lfm2.cpp: is_recr = head_count_kv == 0). MLA files cache one
    latent head of kv_lora_rank + rope dims and no V; legacy DeepSeek-2 files cache every head
    at (nope + rope, v_head).
    """
    layers: list[Layer] = []
    pattern = {"gemma2": 2, "gpt-oss": 2, "gemma3": 6}.get(g.arch, 0)
    for il in range(g.layers):
        if g.recurs(il):
            state = g.ssm.state_bytes() if g.ssm else g.n_embd * (g.shortconv - 1) * 4
            layers.append(Layer(LayerKind.RECURRENT, state_bytes=state))
        elif g.arch == "lfm2" and g.window:
            # lfm2.cpp: with a window every attention layer slides.
            layers.append(
                Layer(LayerKind.SLIDING, g.kv_heads_of(il), g.head_dim, g.v_dim, g.window)
            )
        elif g.mla is not None and not g.mla.legacy:
            m = g.mla
            layers.append(
                Layer(LayerKind.MLA, 1, m.kv_lora_rank + m.qk_rope, 0, indexer_dim=m.indexer)
            )
        elif g.mla is not None:
            m = g.mla
            layers.append(Layer(LayerKind.FULL, g.heads, m.qk_nope + m.qk_rope, m.v_head))
        elif g.kv_heads_of(il) == 0:
            layers.append(Layer(LayerKind.NO_CACHE))
        elif pattern and il % pattern < pattern - 1:
            layers.append(
                Layer(LayerKind.SLIDING, g.kv_heads_of(il), g.head_dim, g.v_dim, g.window)
            )
        else:
            layers.append(Layer(LayerKind.FULL, g.kv_heads_of(il), g.head_dim, g.v_dim))
    kv = [g.kv_heads_of(il) for il in range(g.layers)]
    if g.ssm is not None and not g.hybrid:
        kv = [0]
    return ModelShape(
        architecture=g.arch,
        layers=tuple(layers),
        attention_heads=g.heads,
        kv_heads=g.heads if g.mla and g.mla.legacy else max(kv, default=0),
        trained_context=g.context_length,
    )


# ---------------------------------------------------------------------------------------------
# Writing the file.


class _Tensors:
    """Collects a model's tensors: 1-D in f32, the rest in f16, small random values."""

    def __init__(self, writer: gguf.GGUFWriter, seed: int) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)

    def add(self, name: str, *ne: int) -> None:
        """Add tensor `name` with ggml dimensions `ne` (fastest first)."""
        shape = tuple(reversed(ne))
        data = self.rng.standard_normal(shape).astype(np.float32) * 0.02
        self.writer.add_tensor(name, data if len(ne) == 1 else data.astype(np.float16))

    def embeddings(self, g: Geometry, *, output: bool = True) -> None:
        """token_embd, output_norm and (optionally) output."""
        self.add("token_embd.weight", g.n_embd, VOCAB)
        self.add("output_norm.weight", g.n_embd)
        if output:
            self.add("output.weight", g.n_embd, VOCAB)

    def attention(self, g: Geometry, il: int, q_width: int, *, norms: bool = False) -> None:
        """Separate Q/K/V/O projections of layer `il` (create_tensor_qkv), optional q/k norms."""
        kv = g.kv_heads_of(il)
        self.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        self.add(f"blk.{il}.attn_q.weight", g.n_embd, q_width)
        self.add(f"blk.{il}.attn_k.weight", g.n_embd, kv * g.head_dim)
        self.add(f"blk.{il}.attn_v.weight", g.n_embd, kv * g.v_dim)
        self.add(f"blk.{il}.attn_output.weight", q_width, g.n_embd)
        if norms:
            self.add(f"blk.{il}.attn_k_norm.weight", g.head_dim)
            self.add(f"blk.{il}.attn_q_norm.weight", g.head_dim)

    def ffn(self, g: Geometry, il: int, *, post_norms: bool = False) -> None:
        """The dense gated FFN of layer `il` (ffn_norm, gate, up, down)."""
        self.add(f"blk.{il}.ffn_norm.weight", g.n_embd)
        self.add(f"blk.{il}.ffn_gate.weight", g.n_embd, g.ff_of(il))
        self.add(f"blk.{il}.ffn_up.weight", g.n_embd, g.ff_of(il))
        self.add(f"blk.{il}.ffn_down.weight", g.ff_of(il), g.n_embd)
        if post_norms:
            self.add(f"blk.{il}.post_attention_norm.weight", g.n_embd)
            self.add(f"blk.{il}.post_ffw_norm.weight", g.n_embd)


def _llama_like(t: _Tensors, g: Geometry) -> None:
    """llama.cpp, qwen2.cpp, qwen3.cpp: Q width heads x head size; qwen3 adds q/k norms."""
    t.embeddings(g)
    for il in range(g.layers):
        t.attention(g, il, g.heads * g.head_dim, norms=g.arch == "qwen3")
        t.ffn(g, il)


def _gemma(t: _Tensors, g: Geometry) -> None:
    """gemma2.cpp / gemma3.cpp: tied output, post-attention and post-FFN norms."""
    t.embeddings(g, output=False)
    for il in range(g.layers):
        t.attention(g, il, g.heads * g.head_dim, norms=g.arch == "gemma3")
        t.ffn(g, il, post_norms=True)


def _gpt_oss(t: _Tensors, g: Geometry) -> None:
    """openai-moe.cpp: sinks, biased attention output, MoE with biases."""
    t.embeddings(g)
    ff, ne = g.ff_of(0), g.experts
    for il in range(g.layers):
        t.attention(g, il, g.heads * g.head_dim)
        t.add(f"blk.{il}.post_attention_norm.weight", g.n_embd)
        t.add(f"blk.{il}.attn_sinks.weight", g.heads)
        t.add(f"blk.{il}.attn_output.bias", g.n_embd)
        t.add(f"blk.{il}.ffn_gate_inp.weight", g.n_embd, ne)
        t.add(f"blk.{il}.ffn_gate_inp.bias", ne)
        t.add(f"blk.{il}.ffn_gate_exps.weight", g.n_embd, ff, ne)
        t.add(f"blk.{il}.ffn_up_exps.weight", g.n_embd, ff, ne)
        t.add(f"blk.{il}.ffn_down_exps.weight", ff, g.n_embd, ne)
        t.add(f"blk.{il}.ffn_gate_exps.bias", ff, ne)
        t.add(f"blk.{il}.ffn_up_exps.bias", ff, ne)
        t.add(f"blk.{il}.ffn_down_exps.bias", g.n_embd, ne)


def _deci(t: _Tensors, g: Geometry) -> None:
    """deci.cpp: per-layer KV heads; a layer with none keeps only its output projection."""
    t.embeddings(g)
    for il in range(g.layers):
        if g.kv_heads_of(il) == 0:
            t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
            t.add(f"blk.{il}.attn_output.weight", g.n_embd, g.n_embd)
        else:
            t.attention(g, il, g.heads * g.head_dim)
        t.ffn(g, il)


def _mamba(t: _Tensors, g: Geometry) -> None:
    """mamba.cpp: in/conv/x/dt/A/D/out per layer."""
    assert g.ssm is not None
    s = g.ssm
    t.embeddings(g)
    for il in range(g.layers):
        t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        t.add(f"blk.{il}.ssm_in.weight", g.n_embd, 2 * s.d_inner)
        t.add(f"blk.{il}.ssm_conv1d.weight", s.d_conv, s.d_inner)
        t.add(f"blk.{il}.ssm_conv1d.bias", s.d_inner)
        t.add(f"blk.{il}.ssm_x.weight", s.d_inner, s.dt_rank + 2 * s.d_state)
        t.add(f"blk.{il}.ssm_dt.weight", s.dt_rank, s.d_inner)
        t.add(f"blk.{il}.ssm_dt.bias", s.d_inner)
        t.add(f"blk.{il}.ssm_a", s.d_state, s.d_inner)
        t.add(f"blk.{il}.ssm_d", s.d_inner)
        t.add(f"blk.{il}.ssm_out.weight", s.d_inner, g.n_embd)


def _mamba2(t: _Tensors, g: Geometry) -> None:
    """mamba2.cpp: in (z, xBC, dt), grouped conv, per-head A/D/dt bias, grouped norm, out."""
    assert g.ssm is not None
    s = g.ssm
    conv_dim = s.d_inner + 2 * s.groups * s.d_state
    t.embeddings(g)
    for il in range(g.layers):
        t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        t.add(f"blk.{il}.ssm_in.weight", g.n_embd, s.d_inner + conv_dim + s.dt_rank)
        t.add(f"blk.{il}.ssm_conv1d.weight", s.d_conv, conv_dim)
        t.add(f"blk.{il}.ssm_conv1d.bias", conv_dim)
        t.add(f"blk.{il}.ssm_dt.bias", s.dt_rank)
        t.add(f"blk.{il}.ssm_a", 1, s.dt_rank)
        t.add(f"blk.{il}.ssm_d", 1, s.dt_rank)
        t.add(f"blk.{il}.ssm_norm.weight", s.d_inner // s.groups, s.groups)
        t.add(f"blk.{il}.ssm_out.weight", s.d_inner, g.n_embd)


def _jamba(t: _Tensors, g: Geometry) -> None:
    """jamba.cpp: a Mamba-1 mixer with dt/B/C norms where head_count_kv is 0, attention
    elsewhere; a dense FFN on every layer."""
    assert g.ssm is not None
    s = g.ssm
    t.embeddings(g)
    for il in range(g.layers):
        if g.kv_heads_of(il) == 0:
            t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
            t.add(f"blk.{il}.ssm_in.weight", g.n_embd, 2 * s.d_inner)
            t.add(f"blk.{il}.ssm_conv1d.weight", s.d_conv, s.d_inner)
            t.add(f"blk.{il}.ssm_conv1d.bias", s.d_inner)
            t.add(f"blk.{il}.ssm_x.weight", s.d_inner, s.dt_rank + 2 * s.d_state)
            t.add(f"blk.{il}.ssm_dt_norm.weight", s.dt_rank)
            t.add(f"blk.{il}.ssm_dt.weight", s.dt_rank, s.d_inner)
            t.add(f"blk.{il}.ssm_dt.bias", s.d_inner)
            t.add(f"blk.{il}.ssm_b_norm.weight", s.d_state)
            t.add(f"blk.{il}.ssm_c_norm.weight", s.d_state)
            t.add(f"blk.{il}.ssm_a", s.d_state, s.d_inner)
            t.add(f"blk.{il}.ssm_d", s.d_inner)
            t.add(f"blk.{il}.ssm_out.weight", s.d_inner, g.n_embd)
        else:
            t.attention(g, il, g.n_embd)
        t.add(f"blk.{il}.ffn_norm.weight", g.n_embd)
        t.add(f"blk.{il}.ffn_gate.weight", g.n_embd, g.ff_of(il))
        t.add(f"blk.{il}.ffn_up.weight", g.n_embd, g.ff_of(il))
        t.add(f"blk.{il}.ffn_down.weight", g.ff_of(il), g.n_embd)


def _lfm2(t: _Tensors, g: Geometry) -> None:
    """lfm2.cpp: dense FFN everywhere; attention with q/k norms where head_count_kv > 0, a
    short convolution elsewhere; its own output norm name."""
    t.add("token_embd.weight", g.n_embd, VOCAB)
    t.add("token_embd_norm.weight", g.n_embd)
    t.add("output.weight", g.n_embd, VOCAB)
    for il in range(g.layers):
        t.add(f"blk.{il}.ffn_norm.weight", g.n_embd)
        t.add(f"blk.{il}.ffn_gate.weight", g.n_embd, g.ff_of(il))
        t.add(f"blk.{il}.ffn_up.weight", g.n_embd, g.ff_of(il))
        t.add(f"blk.{il}.ffn_down.weight", g.ff_of(il), g.n_embd)
        t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        if g.kv_heads_of(il) > 0:
            t.add(f"blk.{il}.attn_q_norm.weight", g.head_dim)
            t.add(f"blk.{il}.attn_k_norm.weight", g.head_dim)
            kv = g.kv_heads_of(il)
            t.add(f"blk.{il}.attn_q.weight", g.n_embd, g.n_embd)
            t.add(f"blk.{il}.attn_k.weight", g.n_embd, kv * g.head_dim)
            t.add(f"blk.{il}.attn_v.weight", g.n_embd, kv * g.v_dim)
            t.add(f"blk.{il}.attn_output.weight", g.n_embd, g.n_embd)
        else:
            t.add(f"blk.{il}.shortconv.conv.weight", g.shortconv, g.n_embd)
            t.add(f"blk.{il}.shortconv.in_proj.weight", g.n_embd, 3 * g.n_embd)
            t.add(f"blk.{il}.shortconv.out_proj.weight", g.n_embd, g.n_embd)


def _nemotron_h(t: _Tensors, g: Geometry) -> None:
    """nemotron-h.cpp: a Mamba-2 mixer, an attention block or an up/down MLP per layer."""
    assert g.ssm is not None
    s = g.ssm
    conv_dim = s.d_inner + 2 * s.groups * s.d_state
    t.embeddings(g)
    for il in range(g.layers):
        t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        if g.recurs(il):
            t.add(f"blk.{il}.ssm_in.weight", g.n_embd, 2 * s.d_inner + 2 * s.groups * s.d_state
                  + s.dt_rank)  # fmt: skip
            t.add(f"blk.{il}.ssm_conv1d.weight", s.d_conv, conv_dim)
            t.add(f"blk.{il}.ssm_conv1d.bias", conv_dim)
            t.add(f"blk.{il}.ssm_dt.bias", s.dt_rank)
            t.add(f"blk.{il}.ssm_a", 1, s.dt_rank)
            t.add(f"blk.{il}.ssm_d", 1, s.dt_rank)
            t.add(f"blk.{il}.ssm_norm.weight", s.d_inner // s.groups, s.groups)
            t.add(f"blk.{il}.ssm_out.weight", s.d_inner, g.n_embd)
        elif g.ff_of(il) == 0:
            kv = g.kv_heads_of(il)
            t.add(f"blk.{il}.attn_q.weight", g.n_embd, g.heads * g.head_dim)
            t.add(f"blk.{il}.attn_k.weight", g.n_embd, kv * g.head_dim)
            t.add(f"blk.{il}.attn_v.weight", g.n_embd, kv * g.v_dim)
            t.add(f"blk.{il}.attn_output.weight", g.heads * g.head_dim, g.n_embd)
        else:
            t.add(f"blk.{il}.ffn_down.weight", g.ff_of(il), g.n_embd)
            t.add(f"blk.{il}.ffn_up.weight", g.n_embd, g.ff_of(il))


def _deepseek2(t: _Tensors, g: Geometry) -> None:
    """deepseek2.cpp with every layer dense (leading_dense_block_count = block_count)."""
    assert g.mla is not None
    m = g.mla
    k_head = m.qk_nope + m.qk_rope
    t.embeddings(g)
    for il in range(g.layers):
        t.add(f"blk.{il}.attn_norm.weight", g.n_embd)
        t.add(f"blk.{il}.attn_q_a_norm.weight", m.q_lora_rank)
        t.add(f"blk.{il}.attn_kv_a_norm.weight", m.kv_lora_rank)
        t.add(f"blk.{il}.attn_q_a.weight", g.n_embd, m.q_lora_rank)
        t.add(f"blk.{il}.attn_q_b.weight", m.q_lora_rank, g.heads * k_head)
        t.add(f"blk.{il}.attn_kv_a_mqa.weight", g.n_embd, m.kv_lora_rank + m.qk_rope)
        if m.legacy:
            t.add(f"blk.{il}.attn_kv_b.weight", m.kv_lora_rank, g.heads * (m.qk_nope + m.v_head))
        else:
            t.add(f"blk.{il}.attn_k_b.weight", m.qk_nope, m.kv_lora_rank, g.heads)
            t.add(f"blk.{il}.attn_v_b.weight", m.kv_lora_rank, m.v_head, g.heads)
        t.add(f"blk.{il}.attn_output.weight", g.heads * m.v_head, g.n_embd)
        if m.indexer:
            # deepseek32.cpp: the DSA indexer's key norm, head weights, K and Q projections.
            t.add(f"blk.{il}.indexer.k_norm.weight", m.indexer)
            t.add(f"blk.{il}.indexer.k_norm.bias", m.indexer)
            t.add(f"blk.{il}.indexer.proj.weight", g.n_embd, g.heads)
            t.add(f"blk.{il}.indexer.attn_k.weight", g.n_embd, m.indexer)
            t.add(f"blk.{il}.indexer.attn_q_b.weight", m.q_lora_rank, g.heads * m.indexer)
        t.ffn(g, il)


_WRITERS: dict[str, Callable[[_Tensors, Geometry], None]] = {
    "llama": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "gemma2": _gemma,
    "gemma3": _gemma,
    "gpt-oss": _gpt_oss,
    "deci": _deci,
    "mamba": _mamba,
    "mamba2": _mamba2,
    "jamba": _jamba,
    "lfm2": _lfm2,
    "nemotron_h": _nemotron_h,
    "deepseek2": _deepseek2,
    "deepseek32": _deepseek2,
}


def write_model(g: Geometry, path: Path) -> Path:
    """Write `g` as a GGUF llama.cpp loads.

    Args:
        g: the geometry.
        path: the file to write.
    Returns:
        `path`.
    """
    w = gguf.GGUFWriter(str(path), g.arch)
    w.add_block_count(g.layers)
    w.add_context_length(g.context_length)
    w.add_embedding_length(g.n_embd)
    w.add_feed_forward_length(g.n_ff)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_vocab_size(VOCAB)
    if g.ssm is not None:
        w.add_ssm_conv_kernel(g.ssm.d_conv)
        w.add_ssm_inner_size(g.ssm.d_inner)
        w.add_ssm_state_size(g.ssm.d_state)
        w.add_ssm_time_step_rank(g.ssm.dt_rank)
        if g.ssm.groups:
            w.add_ssm_group_count(g.ssm.groups)
    if g.shortconv:
        w.add_shortconv_l_cache(g.shortconv)
    if g.arch == "nemotron_h":
        w.add_layer_norm_eps(1e-5)
    if g.ssm is not None and not g.hybrid:
        w.add_head_count(0)
        w.add_head_count_kv(0)
    elif g.mla is not None:
        _mla_keys(w, g, g.mla)
    else:
        w.add_head_count(g.heads)
        if isinstance(g.kv_heads, int):
            w.add_head_count_kv(g.kv_heads)
        else:
            w.add_head_count_kv(list(g.kv_heads))
        w.add_key_length(g.head_dim)
        w.add_value_length(g.v_dim)
        w.add_rope_dimension_count(g.head_dim)
    if g.window:
        w.add_sliding_window(g.window)
    if g.experts:
        w.add_expert_count(g.experts)
        w.add_expert_used_count(g.experts_used)
        w.add_expert_feed_forward_length(g.ff_of(0))
    for key, value in g.extra_kv.items():
        w.add_uint32(key, value)
    _WRITERS[g.arch](_Tensors(w, seed=len(g.name)), g)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _mla_keys(w: gguf.GGUFWriter, g: Geometry, m: Mla) -> None:
    """DeepSeek-2 keys as conversion/deepseek.py writes them (new or legacy layout)."""
    w.add_head_count(g.heads)
    w.add_q_lora_rank(m.q_lora_rank)
    w.add_kv_lora_rank(m.kv_lora_rank)
    w.add_rope_dimension_count(m.qk_rope)
    w.add_leading_dense_block_count(g.layers)
    w.add_expert_count(2)
    w.add_expert_used_count(1)
    w.add_expert_shared_count(1)
    w.add_expert_feed_forward_length(g.ff_of(0))
    if m.indexer:
        w.add_indexer_head_count(g.heads)
        w.add_indexer_key_length(m.indexer)
        w.add_indexer_top_k(16)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if m.legacy:
        w.add_head_count_kv(g.heads)
        w.add_key_length(m.qk_nope + m.qk_rope)
        w.add_value_length(m.v_head)
    else:
        w.add_head_count_kv(1)
        w.add_key_length(m.kv_lora_rank + m.qk_rope)
        w.add_value_length(m.kv_lora_rank)
        w.add_key_length_mla(m.qk_nope + m.qk_rope)
        w.add_value_length_mla(m.v_head)
