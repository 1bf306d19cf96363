"""llama.cpp's llama-server as an engine: its context is a pool of `--ctx-size` cells shared
by `--parallel` slots, and `--split-mode layer` places whole layers on each card."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from llmgw.engines.base import CardNeed, CardSplit, SizingRequest
from llmgw.engines.gang import GangLaunch, GangMember, llamacpp_launch
from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, RefusedFlag, switch
from llmgw.engines.llamacpp import grammar as flags
from llmgw.engines.llamacpp.cache import llamacpp_cache, llamacpp_kv_bytes
from llmgw.engines.llamacpp.grammar import (
    CTX_SIZE,
    GRAMMAR,
    LAYER_SPLIT,
    N_GPU_LAYERS,
    PARALLEL,
    SPLIT_MODE,
    TENSOR_SPLIT,
    settings_from_args,
)
from llmgw.engines.llamacpp.overhead import LLAMACPP_RESERVE_BYTES, llamacpp_overhead_bytes
from llmgw.engines.llamacpp.placement import placement
from llmgw.shape import ModelShape

# What the node agent refuses to pass (`llama-server --help`, common/arg.cpp). It parses flags
# exactly (no abbreviations), so the table needs the exact spellings and their short forms.
REFUSED: tuple[RefusedFlag, ...] = (
    ADDRESS_FLAGS,
    RefusedFlag(
        ("--rpc",),
        "it sends the model's tensors to, and runs layers on, servers the caller names",
    ),
    RefusedFlag(
        ("--path",),
        "it serves a folder of the node over HTTP",
    ),
    RefusedFlag(
        ("--slot-save-path", "--log-file"),
        "it makes the engine write files where the caller says",
    ),
    RefusedFlag(
        ("--chat-template-file",),
        "it reads a file the caller names; give the template inline (--chat-template)",
    ),
    RefusedFlag(
        ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"),
        "the agent passes the model from the replica's source",
    ),
)

# What the node agent passes to llama-server (`llama-server --help`, common/arg.cpp): the flags
# that size and tune the engine, exact spellings and short forms (it does not abbreviate); any
# other is refused with its name. The agent config's `allow_flags` adds one.
ALLOWED: tuple[AllowedFlag, ...] = (
    AllowedFlag(CTX_SIZE),
    AllowedFlag(PARALLEL),
    AllowedFlag(flags.CACHE_TYPE_K),
    AllowedFlag(flags.CACHE_TYPE_V),
    # -fa takes on|off|auto since b6325 and was a switch before: read as taking a value.
    AllowedFlag(flags.FLASH_ATTN),
    AllowedFlag(flags.UBATCH_SIZE),
    AllowedFlag(flags.BATCH_SIZE),
    switch(*flags.SWA_FULL),
    switch(*flags.KV_UNIFIED),
    switch(*flags.NO_KV_UNIFIED),
    switch(*flags.KV_UNIFIED_PER_SLOT),
    AllowedFlag(N_GPU_LAYERS),
    AllowedFlag(SPLIT_MODE),
    AllowedFlag(flags.FIT),
    AllowedFlag(TENSOR_SPLIT),
    AllowedFlag(("--main-gpu", "-mg")),
    AllowedFlag(("--device", "-dev")),
    AllowedFlag(("--override-tensor", "-ot")),
    switch("--cpu-moe", "-cmoe"),
    AllowedFlag(("--n-cpu-moe", "-ncmoe")),
    AllowedFlag(("--threads", "-t")),
    AllowedFlag(("--threads-batch", "-tb")),
    AllowedFlag(("--threads-http",)),
    AllowedFlag(("--n-predict", "--predict", "-n")),
    switch("--cont-batching", "-cb"),
    switch("--no-cont-batching", "-nocb"),
    AllowedFlag(("--cache-reuse",)),
    AllowedFlag(("--defrag-thold", "-dt")),
    switch("--context-shift"),
    switch("--no-context-shift"),
    switch("--mlock"),
    switch("--no-mmap"),
    AllowedFlag(("--numa",)),
    AllowedFlag(("--rope-scaling",)),
    AllowedFlag(("--rope-freq-base",)),
    AllowedFlag(("--rope-freq-scale",)),
    AllowedFlag(("--override-kv",)),
    AllowedFlag(("--seed", "-s")),
    AllowedFlag(("--temp",)),
    AllowedFlag(("--top-k",)),
    AllowedFlag(("--top-p",)),
    AllowedFlag(("--min-p",)),
    AllowedFlag(("--repeat-penalty",)),
    switch("--jinja"),
    AllowedFlag(("--chat-template",)),
    AllowedFlag(("--reasoning-format",)),
    AllowedFlag(("--reasoning-budget",)),
    AllowedFlag(("--timeout", "-to")),
    switch("--metrics"),
    switch("--slots"),
    switch("--no-slots"),
    switch("--no-webui"),
    switch("--no-warmup"),
    switch("--verbose", "-v"),
    # common/arg.cpp: `-lv, --verbosity, --log-verbosity N` sets the log threshold.
    AllowedFlag(("--log-verbosity", "--verbosity", "-lv")),
    switch("--log-disable"),
    switch("--log-prefix"),
    switch("--log-timestamps"),
)

# Flags that load other models or code: refused unless the agent config's `allow_flags` names
# them.
GATED: tuple[RefusedFlag, ...] = (
    RefusedFlag(
        ("--model-draft", "-md", "--hf-repo-draft", "-hfd", "--mmproj", "-mm", "--mmproj-url"),
        "it loads a second model (a drafter or a projector) the caller names",
    ),
    RefusedFlag(
        ("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled"),
        "it loads adapter weights the caller names",
    ),
    RefusedFlag(
        ("--grammar-file", "--json-schema-file"),
        "it reads a file the caller names",
    ),
)


def llamacpp_args(args: Sequence[str], *, tokens: int, sequences: int) -> list[str]:
    """llama-server's arguments with its pool set: `--ctx-size` tokens, `--parallel` slots."""
    out = GRAMMAR.set(args, CTX_SIZE, str(tokens))
    return GRAMMAR.set(out, PARALLEL, str(sequences))


def gpu_layers(shape: ModelShape, args: Sequence[str]) -> int:
    """Layers llama-server offloads: `--n-gpu-layers`, all when absent, "all"/"auto" or
    more than the model has."""
    raw = GRAMMAR.get(args, N_GPU_LAYERS)
    try:
        n = int(raw) if raw is not None else -1
    except ValueError:
        n = -1
    return shape.block_count if n < 0 or n > shape.block_count else n


class LlamaCpp:
    """llama-server: slots over one pool of cells, whole layers on each card."""

    name = "llamacpp"
    aliases = ("llama.cpp", "llama-server")
    grammar = GRAMMAR
    split = CardSplit.LAYER_SPLIT
    default_utilisation: float | None = None
    refused_flags: tuple[RefusedFlag, ...] | None = REFUSED
    api_dialect = "llamacpp"
    """llama-server (tools/server/server.cpp) serves /v1/* and its own /completion, /slots."""

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """RPC workers (`rpc-server`) off the head, `--rpc` on it
        (`llmgw.engines.gang.llamacpp_launch`); the profile's own `--rpc` stays refused."""
        return llamacpp_launch(member)

    @property
    def takes_context(self) -> bool:
        """Always: `--ctx-size`."""
        return True

    @property
    def single_card(self) -> bool:
        """Never: layers split over any count of cards."""
        return False

    @property
    def splits_by_heads(self) -> bool:
        """Never: whole layers go to each card."""
        return False

    def slots(self, args: Sequence[str]) -> int:
        """`--parallel` (1 when not set)."""
        return max(GRAMMAR.get_int(args, PARALLEL), 1)

    def context_tokens(self, args: Sequence[str]) -> int:
        """One slot's share of `--ctx-size`; 0 when not set."""
        pool = GRAMMAR.get_int(args, CTX_SIZE)
        return pool // self.slots(args) if pool > 0 else 0

    def pool_tokens(self, tokens: int, slots: int) -> int:
        """`slots` × `tokens` cells: every slot at full length."""
        return tokens * slots

    def with_context(self, args: Sequence[str], tokens: int, slots: int) -> list[str]:
        """`--ctx-size` tokens × slots and `--parallel` slots, written apart."""
        out = GRAMMAR.set(args, CTX_SIZE, str(tokens * slots))
        return GRAMMAR.set(out, PARALLEL, str(slots))

    def with_cards(self, args: Sequence[str], cards: int) -> list[str]:
        """The old `--tensor-split` dropped (it no longer matches the cards) and, on more than
        one card, `--split-mode layer`."""
        out = GRAMMAR.drop(args, TENSOR_SPLIT)
        if cards > 1:
            out = GRAMMAR.set(out, SPLIT_MODE, LAYER_SPLIT)
        return out

    def card_counts(
        self, shape: ModelShape | None, largest: int, args: Sequence[str] = ()
    ) -> list[int]:
        """Any count up to `largest`: layers split over any."""
        return list(range(1, largest + 1))

    def splits_heads(self, cards: int, shape: ModelShape, args: Sequence[str] = ()) -> bool:
        """Always: heads are not split."""
        return True

    def replica_tp(self, cards: int, current: int) -> int:
        """The profile's own: a layer split is not tensor parallel."""
        return current

    def tensor_parallel(self, args: Sequence[str], cards: int) -> tuple[int, int]:
        """No tensor parallel flag: every card its own rank of one stage."""
        return cards or 1, 1

    def cache_dtype_bytes(self, args: Sequence[str], shape: ModelShape) -> Fraction:
        """The model's dtype (the K and V types are sized by `llamacpp_cache`)."""
        return Fraction(shape.kv_dtype_bytes)

    def kv_cache_bytes(
        self, shape: ModelShape, *, tokens: int, sequences: int, tp: int, args: Sequence[str]
    ) -> int:
        """`llamacpp_kv_bytes` for `--ctx-size tokens --parallel sequences`."""
        return llamacpp_kv_bytes(shape, llamacpp_args(args, tokens=tokens, sequences=sequences))

    def card_need(self, shape: ModelShape, asked: SizingRequest) -> CardNeed:
        """llama.cpp's layer placement (`placement`): each card's layers as `--tensor-split`,
        `--split-mode`, `--main-gpu` and `--n-gpu-layers` place them, with their weights, KV
        and a compute buffer; the fullest card against the card less
        `LLAMACPP_RESERVE_BYTES`. `devices` lists every card and the CPU."""
        args, tokens = asked.args, asked.tokens
        sequences = max(asked.slots, 1)
        n = max(asked.cards, 1)
        full_args = llamacpp_args(args, tokens=tokens * sequences, sequences=sequences)
        settings = settings_from_args(full_args)
        cache = llamacpp_cache(shape, settings)
        kv_total = cache.total_bytes
        overhead = llamacpp_overhead_bytes(shape, full_args, n, cache=cache)
        devices = placement(
            shape, full_args, n, compute_bytes=overhead, settings=settings, cache=cache
        )
        on_cards = [d for d in devices if d.device != "CPU"]
        fullest = max(on_cards, key=lambda d: d.weights_bytes + d.kv_bytes + d.compute_bytes)
        memory = asked.card_memory_bytes
        return CardNeed(
            weights_bytes=shape.weights_bytes,
            kv_bytes=kv_total,
            per_card_bytes=fullest.weights_bytes + fullest.kv_bytes + fullest.compute_bytes,
            overhead_bytes=overhead,
            budget_bytes=max(memory - LLAMACPP_RESERVE_BYTES, 1) if memory > 0 else 0,
            cards=n,
            weights_per_card_bytes=fullest.weights_bytes,
            kv_per_card_bytes=fullest.kv_bytes,
            other_bytes=fullest.compute_bytes,
            kv_pool_bytes=fullest.kv_bytes,
            card_total_bytes=memory,
            weights_known=shape.weights_bytes > 0,
            devices=devices,
        )


LLAMACPP = LlamaCpp()
