"""A GGUF header's metadata read as a model's shape, by llama.cpp's own rules.

The rules follow llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570);
file names below are that tree's (src/llama-model.cpp, src/llama-hparams.cpp …). Every rule
is written here from reading that source, none copied.

(Past 500 lines because it is one reader over one header: every rule reads the same metadata
through the same range checks, and the per-architecture tables sit next to the rules using them.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

from gguf import Keys

from llmgw.shape import Compute, Layer, LayerKind, ModelShape, ParallelDims, WeightsLayout
from planner_svc.domain.errors import InvalidShape

# src/llama-hparams.h: LLAMA_MAX_LAYERS; llama.cpp refuses a block_count above it.
MAX_LAYERS = 512
# Generous ceilings for "absurd": far past any released model, far below overflow.
_MAX_HEADS = 1 << 14
_MAX_HEAD_DIM = 1 << 16
_MAX_EMBD = 1 << 20
_MAX_TOKENS = 1 << 32
_MAX_SSM = 1 << 24
_MAX_FF = 1 << 24

# Recurrent state is kept in f32 (src/llama-model.cpp, create_memory: GGML_TYPE_F32 for r and s).
_STATE_DTYPE_BYTES = 4
# conversion/mamba.py and conversion/rwkv.py write context_length = 2**20 "for those who use the
# default", granite.py too for its rope-less hybrids: it is no trained context.
_PLACEHOLDER_CONTEXT = 1 << 20
_PLACEHOLDER_CONTEXT_ARCHS = frozenset(
    {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granitehybrid"}
)

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
# llama.cpp hybrids whose extra caches (KDA, lightning attention, sparse indexers) this reader
# does not model: refusing beats a wrong size.
_UNSUPPORTED_HYBRIDS = frozenset(
    {
        "kimi-linear",
        "kimi-k3",
        "bailingmoe3",
        "glm5-next",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
_LFM2_ARCHS = frozenset({"lfm2", "lfm2moe"})


@dataclass(frozen=True)
class _SwaRule:
    """How one architecture's `load_arch_hparams` decides its sliding layers and window."""

    pattern: int | None
    """Every `pattern`-th layer is dense; None: the file must carry the per-layer bool array."""
    dense_first: bool = False
    """The dense layer opens each group (il % n == 0) instead of closing it."""
    window_default: int | None = None
    """Window when the key is absent; None: llama.cpp requires the key."""
    needs_positive_window: bool = False
    """Sliding only when the resolved window is > 0; otherwise every layer is dense."""
    window_forced: int = 0
    """A window llama.cpp imposes whatever the file says (0: the file's)."""
    only_block_count: int = 0
    """Sliding only for this block_count (0: always)."""
    note: str = ""


# Per-architecture defaults from src/models/<arch>.cpp (notes §5).
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, window_default=4096),
    "gemma3": _SwaRule(6, window_default=0, needs_positive_window=True),
    "gemma3n": _SwaRule(5),
    "gemma4": _SwaRule(None),
    "gemma-embedding": _SwaRule(6),
    "gpt-oss": _SwaRule(2),
    "cohere2": _SwaRule(4),
    "cohere2moe": _SwaRule(4, dense_first=True),
    # llama4.cpp: chunked attention over 8192-token chunks on 3 of 4 layers unless the file
    # says sliding_window = 0.
    "llama4": _SwaRule(
        4,
        window_default=8192,
        needs_positive_window=True,
        window_forced=8192,
        note="llama4: chunked attention (8192-token chunks) on 3 of every 4 layers",
    ),
    "exaone4": _SwaRule(4, window_default=4096, only_block_count=64),
    "exaone-moe": _SwaRule(4),
    "olmo2": _SwaRule(4, window_default=0, needs_positive_window=True),
    "smallthinker": _SwaRule(
        4, dense_first=True, window_default=0, needs_positive_window=True, window_forced=4096
    ),
    "afmoe": _SwaRule(4, window_default=0, needs_positive_window=True),
    "mellum": _SwaRule(4, window_default=0, needs_positive_window=True),
    "muse-glimmer": _SwaRule(4),
    "plamo3": _SwaRule(8, window_default=0, needs_positive_window=True),
    "laguna": _SwaRule(4, dense_first=True, window_default=0, needs_positive_window=True),
    "granite_swa": _SwaRule(None),
    "step35": _SwaRule(None),
    "mimo2": _SwaRule(None),
}


def shape_from_gguf(
    metadata: Mapping[str, object],
    *,
    file_bytes: int = 0,
    tensor_bytes: int = 0,
    source: str = "",
    block_tensor_bytes: Mapping[int, int] | None = None,
    named_tensor_bytes: Mapping[str, int] | None = None,
) -> ModelShape:
    """Read a GGUF header's metadata as the shape llama.cpp would give the model.

    Args:
        metadata: the header's key/value pairs (scalars as int/float/str/bool, arrays as lists).
        file_bytes: the file's size, used as the weights' size when `tensor_bytes` is 0.
        tensor_bytes: the tensors' data size summed from the tensor infos (0 when unknown).
        source: where the metadata came from, carried into errors.
        block_tensor_bytes: the tensor infos' data sizes summed per block (`blk.N.*`), and
        named_tensor_bytes: the other tensors' by name; both absent when the tensor table was
            not read (then `weights_layout` is None).
    Returns:
        A `ModelShape` with format "gguf", one `Layer` per block, cache dtype 2 bytes.
    Raises:
        InvalidShape: a required key is missing, a number is absurd or of the wrong type, a
            per-layer array has the wrong length, or the architecture is one whose cache this
            reader does not model.
    """
    shape = _Reader(metadata, source).shape(file_bytes=file_bytes, tensor_bytes=tensor_bytes)
    if not block_tensor_bytes and not named_tensor_bytes:
        return shape
    layout = weights_layout(
        shape.block_count, block_tensor_bytes or {}, named_tensor_bytes or {}, source
    )
    return replace(shape, weights_layout=layout)


# src/llama-arch.cpp LLM_TENSOR_INFOS: the layer each tensor outside the blocks belongs to.
_INPUT_TENSORS = frozenset(
    {"token_embd", "token_embd_norm", "token_types", "position_embd", "per_layer_token_embd"}
)
_OUTPUT_TENSORS = frozenset(
    {"output", "output_norm", "cls", "cls_out", "enc_output_norm", "dec_output_norm"}
)
# Created for every repeating layer with TENSOR_DUPLICATED (src/llama-model.cpp load_tensors:
# `rope_freqs` "i != 0 ? TENSOR_DUPLICATED : 0"), so each layer's device holds a copy.
_PER_LAYER_TENSORS = frozenset({"rope_freqs", "rope_factors_long", "rope_factors_short"})


def weights_layout(
    n_layer: int,
    block_bytes: Mapping[int, int],
    named_bytes: Mapping[str, int],
    source: str = "",
) -> WeightsLayout:
    """The tensor bytes by llama.cpp layer (`llmgw.shape.WeightsLayout`).

    Raises:
        InvalidShape: a block tensor past `block_count` (llama.cpp refuses such a file: it
            would not be loaded), or a negative size.
    """
    past = [i for i in block_bytes if i >= n_layer or i < 0]
    if past:
        raise InvalidShape(
            message=f"The GGUF holds tensors of block {min(past)} but its block_count is "
            f"{n_layer}; llama.cpp would refuse the file (wrong number of tensors).",
            source=source,
        )
    if any(b < 0 for b in (*block_bytes.values(), *named_bytes.values())):
        raise InvalidShape(message="Tensor sizes cannot be negative.", source=source)
    inputs = outputs = copies = 0
    for name, nbytes in named_bytes.items():
        base = name.split(".", 1)[0]
        if base in _OUTPUT_TENSORS:
            outputs += nbytes
        elif base in _PER_LAYER_TENSORS:
            copies += nbytes
        else:
            inputs += nbytes  # input-layer tensors, and names the table does not list
    # A head tied to the token embeddings: llama.cpp loads token_embd.weight again as the
    # output tensor (TENSOR_DUPLICATED, re-classified as LLM_TENSOR_OUTPUT by the loader).
    tied = "output.weight" not in named_bytes and "token_embd.weight" in named_bytes
    return WeightsLayout(
        layer_bytes=tuple(block_bytes.get(i, 0) for i in range(n_layer)),
        input_bytes=inputs,
        output_bytes=outputs,
        per_layer_copy_bytes=copies,
        head_copy_bytes=named_bytes["token_embd.weight"] if tied else 0,
    )


class _Reader:
    """Typed access to one header's keys, raising InvalidShape with the key's name."""

    def __init__(self, metadata: Mapping[str, object], source: str) -> None:
        self.md = metadata
        self.source = source
        self.notes: list[str] = []
        arch = metadata.get(Keys.General.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            self.fail(
                "The GGUF header has no general.architecture string, so its layers cannot be "
                "read; check that the file is a model (not a vocab or adapter) GGUF."
            )
        self.arch: str = arch

    def fail(self, message: str) -> NoReturn:
        """Raise InvalidShape with `message` and the source."""
        raise InvalidShape(message=message, source=self.source)

    def key(self, template: str) -> str:
        """The key for this architecture, e.g. '{arch}.block_count' -> 'llama.block_count'."""
        return template.format(arch=self.arch)

    def integer(
        self,
        template: str,
        *,
        default: int | None = None,
        minimum: int = 0,
        maximum: int = _MAX_TOKENS,
    ) -> int:
        """A whole-number key; `default` when absent (None: the key is required)."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            if default is None:
                self.fail(
                    f"The GGUF header lacks {key}, which llama.cpp requires for a "
                    f"{self.arch} model; the file is incomplete or from an unknown converter."
                )
            return default
        return self._check_int(key, value, minimum, maximum)

    def _check_int(self, key: str, value: object, minimum: int, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"GGUF key {key} is {value!r}, not a whole number; the header is damaged.")
        if not minimum <= value <= maximum:
            self.fail(
                f"GGUF key {key} is {value}, outside the plausible range {minimum}..{maximum}; "
                "the header is damaged or hostile."
            )
        return value

    def per_layer(
        self, template: str, n_layer: int, default: Sequence[int], maximum: int
    ) -> list[int]:
        """A key that is one number for every layer or an array of one number per layer."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            return list(default)
        if isinstance(value, list):
            if len(value) != n_layer:
                self.fail(
                    f"GGUF key {key} has {len(value)} entries but the model has {n_layer} "
                    "layers; the header is inconsistent."
                )
            return [self._check_int(key, v, 0, maximum) for v in value]
        return [self._check_int(key, value, 0, maximum)] * n_layer

    def flags(self, template: str, n_layer: int) -> list[bool] | None:
        """A per-layer bool array (ints 0/1 accepted), None when absent."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != n_layer:
            self.fail(
                f"GGUF key {key} should be a list of {n_layer} booleans (one per layer) but is "
                f"{_describe(value)}; the header is inconsistent."
            )
        out: list[bool] = []
        for v in value:
            if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
                out.append(bool(v))
            else:
                self.fail(f"GGUF key {key} holds {v!r}, not a boolean; the header is damaged.")
        return out

    def shape(self, *, file_bytes: int, tensor_bytes: int) -> ModelShape:
        """Assemble the shape (see `shape_from_gguf`)."""
        if self.arch in _UNSUPPORTED_HYBRIDS:
            self.fail(
                f"Architecture {self.arch} keeps caches this planner does not model yet; size "
                "it from its Hugging Face config or give its shape explicitly."
            )
        if file_bytes < 0 or tensor_bytes < 0:
            self.fail("File and tensor sizes cannot be negative.")
        n_layer = self.integer(Keys.LLM.BLOCK_COUNT, minimum=1, maximum=MAX_LAYERS)
        # nextn (MTP) blocks are counted in block_count; the main context gives them no cache
        # (src/llama-model.cpp, create_memory: filter il < n_layer()).
        n_nextn = self.integer(Keys.LLM.NEXTN_PREDICT_LAYERS, default=0, maximum=n_layer)
        n_main = n_layer - n_nextn if n_nextn < n_layer else n_layer
        trained = self._trained_context()
        n_embd = self.integer(Keys.LLM.EMBEDDING_LENGTH, minimum=1, maximum=_MAX_EMBD)

        heads = self.per_layer(Keys.Attention.HEAD_COUNT, n_layer, [0] * n_layer, _MAX_HEADS)
        # llama-model.cpp: head_count_kv starts as head_count and is overwritten when present.
        kv_heads = self.per_layer(Keys.Attention.HEAD_COUNT_KV, n_layer, heads, _MAX_HEADS)
        dims = self._head_dims(heads, n_embd)
        recurrent, attends = self._layout(n_layer, n_main, kv_heads)
        state_bytes = self._state_bytes(n_embd) if any(recurrent) else 0
        is_swa, window = self._sliding(n_layer, n_main, attends, recurrent)
        kv_from_start = self._kv_from_start(n_layer)
        mla = self._mla()
        # deepseek32.cpp / llama-kv-cache-dsa.cpp: DeepSeek V3.2's DSA keeps an indexer key cache
        # (one K head of attention.indexer.key_length, at the K type) beside every trunk layer's
        # latent.
        indexer = (
            self.integer(Keys.Attention.Indexer.KEY_LENGTH, maximum=_MAX_HEAD_DIM)
            if self.arch == "deepseek32"
            else 0
        )

        layers: list[Layer] = []
        for il in range(n_layer):
            state = state_bytes if recurrent[il] else 0
            has_kv = attends[il] and kv_heads[il] > 0 and il < kv_from_start
            if not has_kv:
                kind = LayerKind.RECURRENT if recurrent[il] else LayerKind.NO_CACHE
                layers.append(Layer(kind=kind, state_bytes=state))
                continue
            if (dims.k_swa if is_swa[il] else dims.k) <= 0:
                self.fail(
                    f"Layer {il} has {kv_heads[il]} KV heads but no head size (no key_length "
                    "and no head_count to derive it from); the header is inconsistent."
                )
            if is_swa[il]:
                k, v = dims.k_swa, dims.v_swa
                layers.append(Layer(LayerKind.SLIDING, kv_heads[il], k, v, window, state))
            elif mla is not None:
                # src/llama-kv-cache.cpp: an MLA cache stores only K (the latent); V is read
                # back out of it, so V width is 0.
                layers.append(
                    Layer(LayerKind.MLA, kv_heads[il], dims.k, 0, 0, state, indexer_dim=indexer)
                )
            else:
                layers.append(Layer(LayerKind.FULL, kv_heads[il], dims.k, dims.v, 0, state))
        if n_nextn and n_main < n_layer:
            self.notes.append(f"{n_nextn} trailing MTP block(s) keep no cache in the main context")

        if not any(la.has_kv or la.kind is LayerKind.RECURRENT for la in layers):
            self.fail(
                f"The GGUF header gives this {self.arch} model no attention heads (head_count "
                "absent or 0) and no recurrent layers, so nothing would hold its context; the "
                "file is incomplete."
            )
        attention_heads = next(
            (heads[il] for il in range(n_layer) if attends[il] and heads[il] > 0), 0
        )
        kv_layers = [il for il, la in enumerate(layers) if la.has_kv]
        if mla is not None:
            # The cache holds one latent per token; tensor parallel still splits the original
            # query/KV heads, which the converter kept in head_count.
            max_kv = max((heads[il] for il in kv_layers), default=0)
        else:
            max_kv = max((kv_heads[il] for il in kv_layers), default=0)
        return ModelShape(
            architecture=self.arch,
            layers=tuple(layers),
            attention_heads=attention_heads,
            kv_heads=max_kv,
            trained_context=trained,
            weights_bytes=tensor_bytes or file_bytes,
            kv_dtype_bytes=2,
            format="gguf",
            notes=tuple(self.notes),
            mla_expanded=mla,
            parallel=self._parallel(n_layer, attention_heads, dims.k, dims.v, mla is not None),
            compute=self._compute(n_layer, n_embd),
        )

    def _parallel(
        self, n_layer: int, heads: int, k_dim: int, v_dim: int, mla: bool
    ) -> ParallelDims:
        """What tensor parallel splits besides the heads, for engines that load GGUF (vLLM):
        the dense MLP (feed_forward_length: a mixture-of-experts file without
        expert_feed_forward_length gives the expert's width there, as Mixtral's do), expert
        and shared-expert widths, the vocabulary."""
        ff = max(self.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0], _MAX_FF), default=0)
        experts = self.integer(Keys.LLM.EXPERT_COUNT, default=0, maximum=1 << 20)
        expert_ff = self.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, default=0, maximum=_MAX_FF)
        dense_lead = self.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, default=0, maximum=n_layer)
        shared = self.integer(
            Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0, maximum=_MAX_FF
        ) or expert_ff * self.integer(Keys.LLM.EXPERT_SHARED_COUNT, default=0, maximum=1 << 10)
        if experts == 0:
            dense, expert = ff, 0
        else:
            expert = expert_ff or ff
            dense = ff if expert_ff and dense_lead > 0 else 0
        vocab = self._vocab()
        return ParallelDims(
            vocab=vocab,
            dense_intermediate=dense,
            expert_intermediate=expert,
            shared_intermediate=shared if experts else 0,
            q_head_dim=0 if mla else k_dim,
            o_head_dim=0 if mla else v_dim,
        )

    def _vocab(self) -> int:
        """The vocabulary: {arch}.vocab_size, else the tokenizer's token list's length (kept
        as a list, or summarised by the header reader with its `length`)."""
        tokens = self.md.get(Keys.Tokenizer.LIST)
        listed = len(tokens) if isinstance(tokens, list) else getattr(tokens, "length", 0)
        listed = listed if isinstance(listed, int) and 0 < listed <= 1 << 24 else 0
        return self.integer(Keys.LLM.VOCAB_SIZE, default=0, maximum=1 << 24) or listed

    def _compute(self, n_layer: int, n_embd: int) -> Compute:
        """The widths a forward pass follows (llmgw.shape.Compute), for the activation and
        compute-buffer estimates: embedding_length, feed_forward_length (the widest layer's;
        a mixture-of-experts file without expert_feed_forward_length gives the expert's width
        there, as Mixtral's do), expert_count, expert_used_count, expert and shared-expert
        widths, leading_dense_block_count, the vocabulary. A GGUF holds no vision encoder
        (that is a separate mmproj file)."""
        ff = max(self.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0], _MAX_FF), default=0)
        experts = self.integer(Keys.LLM.EXPERT_COUNT, default=0, maximum=1 << 20)
        used = self.integer(Keys.LLM.EXPERT_USED_COUNT, default=0, maximum=1 << 20)
        expert_ff = self.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, default=0, maximum=_MAX_FF)
        dense_lead = self.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, default=0, maximum=n_layer)
        shared = self.integer(
            Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0, maximum=_MAX_FF
        ) or expert_ff * self.integer(Keys.LLM.EXPERT_SHARED_COUNT, default=0, maximum=1 << 10)
        moe = experts > 1
        return Compute(
            hidden_size=n_embd,
            intermediate_size=ff,
            vocab_size=self._vocab(),
            experts=experts if moe else 0,
            experts_per_token=used if moe else 0,
            expert_intermediate_size=(expert_ff or ff) if moe else 0,
            shared_intermediate_size=shared if moe else 0,
            dense_layers=dense_lead if moe else 0,
        )

    def _trained_context(self) -> int:
        # llama-model.cpp load_hparams: context_length is mandatory (n_ctx_train).
        ctx = self.integer(Keys.LLM.CONTEXT_LENGTH, minimum=1, maximum=_MAX_TOKENS)
        if self.arch in _PLACEHOLDER_CONTEXT_ARCHS and ctx == _PLACEHOLDER_CONTEXT:
            self.notes.append(
                f"{self.arch}: context_length {ctx} is the converter's placeholder, not a "
                "trained context; the trained context is unknown"
            )
            return 0
        return ctx

    def _head_dims(self, heads: Sequence[int], n_embd: int) -> _HeadDims:
        # llama-model.cpp load_hparams: head size defaults to n_embd / n_head and is replaced
        # by key_length / value_length; SWA sizes default to those and are replaced by *_swa.
        # llama.cpp divides by layer 0's head count; we take the first non-zero one so that
        # a hybrid whose first layer is recurrent still gets a size.
        first = next((h for h in heads if h > 0), 0)
        derived = n_embd // first if first else 0
        k = self.integer(Keys.Attention.KEY_LENGTH, default=derived, maximum=_MAX_HEAD_DIM)
        v = self.integer(Keys.Attention.VALUE_LENGTH, default=derived, maximum=_MAX_HEAD_DIM)
        k_swa = self.integer(Keys.Attention.KEY_LENGTH_SWA, default=k, maximum=_MAX_HEAD_DIM)
        v_swa = self.integer(Keys.Attention.VALUE_LENGTH_SWA, default=v, maximum=_MAX_HEAD_DIM)
        return _HeadDims(k, v, k_swa, v_swa)

    def _mla(self) -> tuple[int, int] | None:
        """(key_length_mla, value_length_mla) for an MLA-cached file, None otherwise."""
        k_key = self.key(Keys.Attention.KEY_LENGTH_MLA)
        v_key = self.key(Keys.Attention.VALUE_LENGTH_MLA)
        k = self.integer(Keys.Attention.KEY_LENGTH_MLA, default=0, maximum=_MAX_HEAD_DIM)
        v = self.integer(Keys.Attention.VALUE_LENGTH_MLA, default=0, maximum=_MAX_HEAD_DIM)
        # llama-hparams.cpp is_mla(): both set, or neither.
        if (k == 0) != (v == 0):
            self.fail(
                f"GGUF keys {k_key} and {v_key} must both be set or both absent; the header "
                "is inconsistent."
            )
        if k:
            return (k, v)
        if self.arch == "deepseek2" and self.md.get(self.key(Keys.Attention.KV_LORA_RANK)):
            # Older deepseek2 conversions (2024 - early 2025) carry the decompressed heads;
            # llama.cpp then caches full per-head K and V (ground truth gt-020).
            self.notes.append(
                f"{self.arch}: old-format MLA file (no key_length_mla); llama.cpp caches the "
                "expanded per-head K/V, several times the latent; a re-converted file is smaller"
            )
        return None

    def _layout(
        self, n_layer: int, n_main: int, kv_heads: Sequence[int]
    ) -> tuple[list[bool], list[bool]]:
        """Per layer: (is recurrent, has attention KV) by the architecture's hybrid rule."""
        main = [il < n_main for il in range(n_layer)]
        if self.arch in _RECURRENT_ARCHS:
            return list(main), [False] * n_layer
        if self.arch == "falcon-h1":
            # llama-model.cpp create_memory: Falcon-H1 runs attention and Mamba2 side by side
            # in every layer (both filters return true).
            return [True] * n_layer, [True] * n_layer
        if self.arch in _HYBRID_BY_KV_HEADS:
            recurrent = [main[il] and kv_heads[il] == 0 for il in range(n_layer)]
            return recurrent, [main[il] and not recurrent[il] for il in range(n_layer)]
        if self.arch in _HYBRID_NEMOTRON:
            ff = self.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0] * n_layer, 1 << 24)
            recurrent = [main[il] and kv_heads[il] == 0 and ff[il] == 0 for il in range(n_layer)]
            # MLP-only blocks (no heads, an FFN) keep nothing.
            attends = [main[il] and kv_heads[il] > 0 and ff[il] == 0 for il in range(n_layer)]
            return recurrent, attends
        if self.arch in _HYBRID_BY_INTERVAL:
            recurrent = self._interval_layout(n_layer, n_main)
            return recurrent, [main[il] and not recurrent[il] for il in range(n_layer)]
        return [False] * n_layer, list(main)

    def _interval_layout(self, n_layer: int, n_main: int) -> list[bool]:
        # qwen3next.cpp: attention.recurrent_layers (one flag or one per layer) if present,
        # else layer il is full attention when (il + 1) % full_attention_interval == 0.
        key = self.key("{arch}.attention.recurrent_layers")
        given = self.md.get(key)
        if isinstance(given, bool):
            return [given and il < n_main for il in range(n_layer)]
        flags = self.flags("{arch}.attention.recurrent_layers", n_layer)
        if flags is not None:
            return flags
        interval = self.integer(Keys.LLM.FULL_ATTENTION_INTERVAL, default=4, minimum=1)
        return [il < n_main and (il + 1) % interval != 0 for il in range(n_layer)]

    def _state_bytes(self, n_embd: int) -> int:
        """One recurrent layer's state per sequence, in f32 (llama-hparams.cpp n_embd_r/s)."""
        if self.arch in _RWKV_ARCHS:
            # RWKV: token-shift rows (token_shift_count x n_embd, default count 2 per
            # llama-hparams.h) + the WKV state (n_embd x head size).
            head = self.integer(Keys.WKV.HEAD_SIZE, minimum=1, maximum=_MAX_HEAD_DIM)
            shifts = self.integer(Keys.LLM.TOKEN_SHIFT_COUNT, default=2, maximum=16)
            return (shifts * n_embd + n_embd * head) * _STATE_DTYPE_BYTES
        if self.arch in _LFM2_ARCHS:
            # LFM2 short convolution: n_embd x (L_cache - 1); no SSM state.
            l_cache = self.integer(Keys.ShortConv.L_CACHE, minimum=1, maximum=1 << 16)
            return n_embd * (l_cache - 1) * _STATE_DTYPE_BYTES
        # Mamba-style SSM: conv state (conv_kernel - 1) x (inner + 2 x groups x state) (the
        # first column is shifted out, hence -1) + SSM state state x inner.
        kernel = self.integer(Keys.SSM.CONV_KERNEL, minimum=1, maximum=1 << 10)
        inner = self.integer(Keys.SSM.INNER_SIZE, minimum=1, maximum=_MAX_SSM)
        state = self.integer(Keys.SSM.STATE_SIZE, minimum=1, maximum=_MAX_SSM)
        groups = self.integer(Keys.SSM.GROUP_COUNT, default=0, maximum=_MAX_SSM)
        conv = (kernel - 1) * (inner + 2 * groups * state)
        return (conv + state * inner) * _STATE_DTYPE_BYTES

    def _sliding(
        self, n_layer: int, n_main: int, attends: Sequence[bool], recurrent: Sequence[bool]
    ) -> tuple[list[bool], int]:
        """Per layer whether it slides, and the window (0 when none slides)."""
        none = [False] * n_layer
        window_key = self.key(Keys.Attention.SLIDING_WINDOW)
        file_window = self.md.get(window_key)
        if self.arch == "phi3":
            # phi3.cpp: "Phi SWA is currently disabled" (llama.cpp PR 13676): every layer full.
            if file_window:
                self.notes.append(
                    f"phi3: sliding_window {file_window} ignored, as llama.cpp disables Phi SWA"
                )
            return none, 0
        if self.arch in _LFM2_ARCHS:
            # lfm2.cpp: with a window > 0 every attention layer slides.
            window = self.integer(Keys.Attention.SLIDING_WINDOW, default=0)
            if window > 0 and self.arch == "lfm2":
                return [attends[il] and not recurrent[il] for il in range(n_layer)], window
            return none, 0
        rule = _SWA_RULES.get(self.arch)
        if rule is None:
            if file_window:
                self.notes.append(
                    f"{self.arch}: sliding_window {file_window} ignored, as llama.cpp does for "
                    "this architecture; every layer is counted in full"
                )
            return none, 0
        if rule.only_block_count and n_layer != rule.only_block_count:
            return none, 0
        window = self.integer(Keys.Attention.SLIDING_WINDOW, default=rule.window_default)
        if rule.needs_positive_window and window <= 0:
            return none, 0
        if rule.window_forced:
            window = rule.window_forced
        is_swa = self._swa_pattern(rule, n_layer, n_main)
        if any(is_swa) and window <= 0:
            self.fail(
                f"GGUF key {window_key} is {window} but {self.arch} layers slide; the header "
                "is inconsistent."
            )
        if rule.note:
            self.notes.append(rule.note)
        return is_swa, window if any(is_swa) else 0

    def _swa_pattern(self, rule: _SwaRule, n_layer: int, n_main: int) -> list[bool]:
        # llama-model.cpp load_swa_pattern: a per-layer bool array under
        # sliding_window_pattern wins; else an integer there overrides the default n.
        key = self.key(Keys.Attention.SLIDING_WINDOW_PATTERN)
        given = self.md.get(key)
        if isinstance(given, list):
            flags = self.flags(Keys.Attention.SLIDING_WINDOW_PATTERN, n_layer)
            assert flags is not None
            return flags
        if rule.pattern is None:
            self.fail(
                f"{self.arch} files must say which layers slide in {key} (one boolean per "
                f"layer), but it is {_describe(given)}; re-convert the model."
            )
        n = rule.pattern
        if given is not None:
            n = self._check_int(key, given, 0, MAX_LAYERS)
        # llama-hparams.cpp set_swa_pattern: n = 0 slides every layer, n = 1 none; otherwise
        # the last (or, dense_first, the first) layer of each group of n is dense. nextn
        # blocks never slide.
        out = []
        for il in range(n_layer):
            if il >= n_main:
                out.append(False)
            elif n == 0:
                out.append(True)
            elif rule.dense_first:
                out.append(il % n != 0)
            else:
                out.append(il % n < n - 1)
        return out

    def _kv_from_start(self, n_layer: int) -> int:
        """Layers from this index on reuse an earlier layer's KV (gemma3n/gemma4 tails)."""
        if self.arch == "gemma3n":
            # gemma3n.cpp hard-codes n_layer_kv_from_start = 20.
            return min(20, n_layer)
        if self.arch == "gemma4":
            shared = self.integer(Keys.Attention.SHARED_KV_LAYERS, default=0, maximum=n_layer)
            if shared and n_layer - shared < 2:
                # llama-model.cpp asserts n_layer_kv_from_start >= 2 when reusing.
                self.fail(
                    f"GGUF key {self.key(Keys.Attention.SHARED_KV_LAYERS)} is {shared} of "
                    f"{n_layer} layers; at least 2 layers must keep their own KV."
                )
            return n_layer - shared
        return n_layer


@dataclass(frozen=True)
class _HeadDims:
    """Head sizes of full-attention and sliding layers."""

    k: int
    v: int
    k_swa: int
    v_swa: int


def _describe(value: object) -> str:
    if value is None:
        return "absent"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return repr(value)
