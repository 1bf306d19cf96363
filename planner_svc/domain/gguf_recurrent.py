"""Which layers of a GGUF model are recurrent and what state each keeps, by llama.cpp's rule
for each recurrent and hybrid architecture family (src/models/<arch>.cpp)."""

from __future__ import annotations

from collections.abc import Sequence

from gguf import Keys

from planner_svc.domain.gguf_header import MAX_HEAD_DIM, MAX_SSM, HeaderReader

# Recurrent state is kept in f32 (src/llama-model.cpp, create_memory: GGML_TYPE_F32 for r and s).
_STATE_DTYPE_BYTES = 4
# src/llama-arch.cpp llm_arch_is_recurrent: every layer is recurrent, none has KV.
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
_RWKV_ARCHS = frozenset({"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Hybrids whose recurrent layers are the ones with head_count_kv == 0 (src/models/jamba.cpp,
# granite-hybrid.cpp, lfm2.cpp, lfm2moe.cpp, plamo2.cpp).
_HYBRID_BY_KV_HEADS = frozenset({"jamba", "granitehybrid", "lfm2", "lfm2moe", "plamo2"})
# Hybrids laid out by attention.recurrent_layers or full_attention_interval (qwen3next.cpp,
# qwen35.cpp).
_HYBRID_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})
# nemotron-h.cpp: recurrent iff head_count_kv == 0 and feed_forward_length == 0.
_HYBRID_NEMOTRON = frozenset({"nemotron_h", "nemotron_h_moe"})
# lfm2.cpp, lfm2moe.cpp: short-convolution hybrids (their state here, their window in
# gguf_sliding.py).
LFM2_ARCHS = frozenset({"lfm2", "lfm2moe"})


def recurrent_layout(
    reader: HeaderReader, n_layer: int, n_main: int, kv_heads: Sequence[int]
) -> tuple[list[bool], list[bool]]:
    """Per layer: (is recurrent, has attention KV) by the architecture's hybrid rule."""
    main = [il < n_main for il in range(n_layer)]
    if reader.arch in _RECURRENT_ARCHS:
        return list(main), [False] * n_layer
    if reader.arch == "falcon-h1":
        # llama-model.cpp create_memory: Falcon-H1 runs attention and Mamba2 side by side
        # in every layer (both filters return true).
        return [True] * n_layer, [True] * n_layer
    if reader.arch in _HYBRID_BY_KV_HEADS:
        recurrent = [main[il] and kv_heads[il] == 0 for il in range(n_layer)]
        return recurrent, [main[il] and not recurrent[il] for il in range(n_layer)]
    if reader.arch in _HYBRID_NEMOTRON:
        ff = reader.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0] * n_layer, 1 << 24)
        recurrent = [main[il] and kv_heads[il] == 0 and ff[il] == 0 for il in range(n_layer)]
        # MLP-only blocks (no heads, an FFN) keep nothing.
        attends = [main[il] and kv_heads[il] > 0 and ff[il] == 0 for il in range(n_layer)]
        return recurrent, attends
    if reader.arch in _HYBRID_BY_INTERVAL:
        recurrent = _interval_layout(reader, n_layer, n_main)
        return recurrent, [main[il] and not recurrent[il] for il in range(n_layer)]
    return [False] * n_layer, list(main)


def _interval_layout(reader: HeaderReader, n_layer: int, n_main: int) -> list[bool]:
    # qwen3next.cpp: attention.recurrent_layers (one flag or one per layer) if present,
    # else layer il is full attention when (il + 1) % full_attention_interval == 0.
    key = reader.key("{arch}.attention.recurrent_layers")
    given = reader.md.get(key)
    if isinstance(given, bool):
        return [given and il < n_main for il in range(n_layer)]
    flags = reader.flags("{arch}.attention.recurrent_layers", n_layer)
    if flags is not None:
        return flags
    interval = reader.integer(Keys.LLM.FULL_ATTENTION_INTERVAL, default=4, minimum=1)
    return [il < n_main and (il + 1) % interval != 0 for il in range(n_layer)]


def recurrent_state_bytes(reader: HeaderReader, n_embd: int) -> int:
    """One recurrent layer's state per sequence, in f32 (llama-hparams.cpp n_embd_r/s)."""
    if reader.arch in _RWKV_ARCHS:
        # RWKV: token-shift rows (token_shift_count x n_embd, default count 2 per
        # llama-hparams.h) + the WKV state (n_embd x head size).
        head = reader.integer(Keys.WKV.HEAD_SIZE, minimum=1, maximum=MAX_HEAD_DIM)
        shifts = reader.integer(Keys.LLM.TOKEN_SHIFT_COUNT, default=2, maximum=16)
        return (shifts * n_embd + n_embd * head) * _STATE_DTYPE_BYTES
    if reader.arch in LFM2_ARCHS:
        # LFM2 short convolution: n_embd x (L_cache - 1); no SSM state.
        l_cache = reader.integer(Keys.ShortConv.L_CACHE, minimum=1, maximum=1 << 16)
        return n_embd * (l_cache - 1) * _STATE_DTYPE_BYTES
    # Mamba-style SSM: conv state (conv_kernel - 1) x (inner + 2 x groups x state) (the
    # first column is shifted out, hence -1) + SSM state state x inner.
    kernel = reader.integer(Keys.SSM.CONV_KERNEL, minimum=1, maximum=1 << 10)
    inner = reader.integer(Keys.SSM.INNER_SIZE, minimum=1, maximum=MAX_SSM)
    state = reader.integer(Keys.SSM.STATE_SIZE, minimum=1, maximum=MAX_SSM)
    groups = reader.integer(Keys.SSM.GROUP_COUNT, default=0, maximum=MAX_SSM)
    conv = (kernel - 1) * (inner + 2 * groups * state)
    return (conv + state * inner) * _STATE_DTYPE_BYTES
