"""A GGUF header's metadata read as a model's shape, by llama.cpp's own rules.

The rules follow llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570);
file names in these modules are that tree's (src/llama-model.cpp, src/llama-hparams.cpp …).
Every rule is written here from reading that source, none copied.

The header is read through gguf_header.py; the recurrent and hybrid families' layouts are
gguf_recurrent.py, the sliding-window families' gguf_sliding.py, the tensor bytes per layer
gguf_weights.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gguf import Keys

from llmgw.shape import Compute, Layer, LayerKind, ModelShape, ParallelDims
from planner_svc.domain.gguf_header import (
    MAX_EMBD,
    MAX_FF,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_TOKENS,
    HeaderReader,
)
from planner_svc.domain.gguf_recurrent import recurrent_layout, recurrent_state_bytes
from planner_svc.domain.gguf_sliding import sliding_layers
from planner_svc.domain.gguf_weights import weights_layout

# conversion/mamba.py and conversion/rwkv.py write context_length = 2**20 "for those who use the
# default", granite.py too for its rope-less hybrids: it is no trained context.
_PLACEHOLDER_CONTEXT = 1 << 20
_PLACEHOLDER_CONTEXT_ARCHS = frozenset(
    {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granitehybrid"}
)

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


class _Reader(HeaderReader):
    """One header read as a model's shape."""

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
        n_embd = self.integer(Keys.LLM.EMBEDDING_LENGTH, minimum=1, maximum=MAX_EMBD)

        heads = self.per_layer(Keys.Attention.HEAD_COUNT, n_layer, [0] * n_layer, MAX_HEADS)
        # llama-model.cpp: head_count_kv starts as head_count and is overwritten when present.
        kv_heads = self.per_layer(Keys.Attention.HEAD_COUNT_KV, n_layer, heads, MAX_HEADS)
        dims = self._head_dims(heads, n_embd)
        recurrent, attends = recurrent_layout(self, n_layer, n_main, kv_heads)
        state_bytes = recurrent_state_bytes(self, n_embd) if any(recurrent) else 0
        is_swa, window = sliding_layers(self, n_layer, n_main, attends, recurrent)
        kv_from_start = self._kv_from_start(n_layer)
        mla = self._mla()
        # deepseek32.cpp / llama-kv-cache-dsa.cpp: DeepSeek V3.2's DSA keeps an indexer key cache
        # (one K head of attention.indexer.key_length, at the K type) beside every trunk layer's
        # latent.
        indexer = (
            self.integer(Keys.Attention.Indexer.KEY_LENGTH, maximum=MAX_HEAD_DIM)
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
        ff = max(self.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0], MAX_FF), default=0)
        experts = self.integer(Keys.LLM.EXPERT_COUNT, default=0, maximum=1 << 20)
        expert_ff = self.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, default=0, maximum=MAX_FF)
        dense_lead = self.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, default=0, maximum=n_layer)
        shared = self.integer(
            Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0, maximum=MAX_FF
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
        ff = max(self.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer, [0], MAX_FF), default=0)
        experts = self.integer(Keys.LLM.EXPERT_COUNT, default=0, maximum=1 << 20)
        used = self.integer(Keys.LLM.EXPERT_USED_COUNT, default=0, maximum=1 << 20)
        expert_ff = self.integer(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, default=0, maximum=MAX_FF)
        dense_lead = self.integer(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, default=0, maximum=n_layer)
        shared = self.integer(
            Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0, maximum=MAX_FF
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
        ctx = self.integer(Keys.LLM.CONTEXT_LENGTH, minimum=1, maximum=MAX_TOKENS)
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
        k = self.integer(Keys.Attention.KEY_LENGTH, default=derived, maximum=MAX_HEAD_DIM)
        v = self.integer(Keys.Attention.VALUE_LENGTH, default=derived, maximum=MAX_HEAD_DIM)
        k_swa = self.integer(Keys.Attention.KEY_LENGTH_SWA, default=k, maximum=MAX_HEAD_DIM)
        v_swa = self.integer(Keys.Attention.VALUE_LENGTH_SWA, default=v, maximum=MAX_HEAD_DIM)
        return _HeadDims(k, v, k_swa, v_swa)

    def _mla(self) -> tuple[int, int] | None:
        """(key_length_mla, value_length_mla) for an MLA-cached file, None otherwise."""
        k_key = self.key(Keys.Attention.KEY_LENGTH_MLA)
        v_key = self.key(Keys.Attention.VALUE_LENGTH_MLA)
        k = self.integer(Keys.Attention.KEY_LENGTH_MLA, default=0, maximum=MAX_HEAD_DIM)
        v = self.integer(Keys.Attention.VALUE_LENGTH_MLA, default=0, maximum=MAX_HEAD_DIM)
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
