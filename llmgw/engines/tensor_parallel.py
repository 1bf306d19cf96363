"""Engines that split every layer over their cards by heads (vLLM, SGLang, TensorRT-LLM):
the rules they share. Each engine's module names its flags, cache pool, overhead and budget.

A card holds ceil(weights / (tp × pp)), its heads' share of its pipeline stage's KV, and the
engine's overhead; the count of cards must split the model's heads and widths (`heads.tp_failure`).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from fractions import Fraction
from typing import ClassVar

from llmgw.engines.base import CardNeed, CardSplit, CardTotals, Overhead, SizingRequest
from llmgw.engines.gang import EngineSingleNode, GangLaunch, GangMember
from llmgw.engines.grammar import Flag, Grammar, RefusedFlag
from llmgw.engines.heads import TpOptions, tp_failure
from llmgw.engines.kvcache import (
    CachePool,
    layer_bytes_on_card,
    layer_costs,
    stage_counts,
    token_bytes_on_card,
)
from llmgw.engines.memo import memo_table
from llmgw.frozen import made
from llmgw.shape import Layer, ModelShape


class TensorParallelEngine:
    """The shared half of a tensor-parallel engine; a subclass sets the class attributes
    and writes `pool` and `overhead_and_budget`."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    grammar: Grammar = Grammar("")
    split: CardSplit = CardSplit.TENSOR_PARALLEL
    api_dialect: str = "openai"
    """vLLM's, SGLang's and trtllm-serve's servers all answer the OpenAI-compatible routes."""
    default_utilisation: float | None = None
    refused_flags: tuple[RefusedFlag, ...] | None = None

    context_flag: Flag = ()
    """The flag that sets one request's context."""
    tp_flag: Flag = ()
    """The flag that sets the tensor parallel size (the card count is written here)."""
    pp_flag: Flag = ()
    """The flag that sets the pipeline parallel size."""
    revision_flag: Flag = ()
    """The flag that pins the Hugging Face revision (branch, tag or commit) the engine loads;
    () when it has none."""
    cache_dtype_flag: Flag = ()
    """The flag that sets the KV cache's element type (empty: the model's dtype)."""
    cache_dtypes: ClassVar[Mapping[str, Fraction | None]] = {}
    """Bytes per element of each cache type the flag takes; None: the model's dtype."""
    batch_flag: Flag = ()
    """The flag that caps concurrent requests (a batch asked of the planner is written here)."""

    # --- the protocol, shared ---------------------------------------------------------------

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """No multi-node launch unless the engine has one (vLLM, SGLang override this).

        Raises:
            EngineSingleNode: always, here.
        """
        raise EngineSingleNode(
            f"{self.name} has no multi-node launch the node agent can drive: serve it on one "
            "node (nodes 1)",
            engine=self.name,
            nodes=member.nnodes,
        )

    @property
    def takes_context(self) -> bool:
        """Whether a context is set through the arguments."""
        return bool(self.context_flag)

    @property
    def single_card(self) -> bool:
        """Never: tensor parallel runs on any count that splits the heads."""
        return False

    @property
    def splits_by_heads(self) -> bool:
        """Always: the card count must split the heads."""
        return True

    def context_tokens(self, args: Sequence[str]) -> int:
        """The context flag's value; 0 when absent."""
        return self.grammar.get_int(args, self.context_flag) if self.context_flag else 0

    def slots(self, args: Sequence[str]) -> int:
        """One: these engines' pools are not split into slots."""
        return 1

    def pool_tokens(self, tokens: int, slots: int) -> int:
        """One request's context: the pool is shared, not sized per slot."""
        return tokens

    def with_context(self, args: Sequence[str], tokens: int, slots: int) -> list[str]:
        """The context flag set to `tokens`, where it stood."""
        return self.grammar.set(args, self.context_flag, str(tokens))

    def with_cards(self, args: Sequence[str], cards: int) -> list[str]:
        """The tensor parallel flag set to `cards`, under whichever alias and spelling the
        arguments already use."""
        return self.grammar.set(args, self.tp_flag, str(cards))

    def card_counts(
        self, shape: ModelShape | None, largest: int, args: Sequence[str] = ()
    ) -> list[int]:
        """The counts up to `largest` that pass every tensor parallel check (all of them when
        the shape is unknown)."""
        counts = range(1, largest + 1)
        if shape is None:
            return list(counts)
        return [n for n in counts if self.splits_heads(n, shape, args)]

    def splits_heads(self, cards: int, shape: ModelShape, args: Sequence[str] = ()) -> bool:
        """Whether tensor parallel over `cards` passes every check of `heads.tp_failure`
        (heads, KV heads, MLP and expert widths, vision encoder, quantized shards)."""
        return self.tp_failure(cards, shape, args) is None

    def tp_failure(self, cards: int, shape: ModelShape, args: Sequence[str] = ()) -> str | None:
        """The check tensor parallel over `cards` fails, in words (None: it passes); `args`
        only for the flags that lift a check (`tp_options`): `with_cards` writes the count as
        the tensor parallel size."""
        return tp_failure(cards, shape, self.tp_options(args))

    def tp_options(self, args: Sequence[str]) -> TpOptions:
        """What the arguments change about the checks (nothing, unless an engine says)."""
        return TpOptions()

    def replica_tp(self, cards: int, current: int) -> int:
        """The card count: every card is a tensor parallel rank."""
        return cards

    def tensor_parallel(self, args: Sequence[str], cards: int) -> tuple[int, int]:
        """The (tensor, pipeline) parallel sizes a replica on `cards` cards runs with.

        The arguments decide when their tp × pp is `cards` (or `cards` is 0), and a tp alone
        that divides the cards leaves the rest to pipeline stages (vLLM across nodes);
        otherwise the cards do: tp = cards / pp when pp divides them, else tp = cards, pp = 1.

        Raises:
            EngineRefuses: a tp or pp flag that is not a positive whole number.
        """
        tp_arg = self.grammar.count(args, self.tp_flag)
        pp_arg = self.grammar.count(args, self.pp_flag)
        pp = pp_arg or 1
        if cards == 0:
            return tp_arg or 1, pp
        if tp_arg is not None and tp_arg * pp == cards:
            return tp_arg, pp
        if tp_arg is not None and pp_arg is None and cards % tp_arg == 0:
            return tp_arg, cards // tp_arg
        if cards % pp == 0:
            return cards // pp, pp
        return cards, 1

    def cache_dtype_bytes(self, args: Sequence[str], shape: ModelShape) -> Fraction:
        """The cache type flag's element bytes ("auto" and absent: the model's dtype).

        Raises:
            EngineRefuses: a type the engine does not take, or one the planner does not size.
        """
        raw = self.grammar.get(args, self.cache_dtype_flag) if self.cache_dtype_flag else None
        if raw is None:
            return Fraction(shape.kv_dtype_bytes)
        key = raw.strip().lower()
        if key not in self.cache_dtypes:
            raise self.grammar.refuse(
                f"{self.name} {self.cache_dtype_flag[0]} {raw!r} is not a cache type the "
                f"planner can size: use one of {', '.join(self.cache_dtypes)}",
                f"{self.cache_dtype_flag[0]}={raw}",
            )
        size = self.cache_dtypes[key]
        return Fraction(shape.kv_dtype_bytes) if size is None else size

    def cache_shape(self, shape: ModelShape, args: Sequence[str]) -> ModelShape:
        """The shape as the engine lays out its cache under `args` (the shape itself, unless
        an engine stores a layer otherwise: SGLang's DeepSeek V3.2 rows by backend)."""
        return shape

    def kv_cache_bytes(
        self, shape: ModelShape, *, tokens: int, sequences: int, tp: int, args: Sequence[str]
    ) -> int:
        """Each card's layers as `pool` keeps them, × tp cards."""
        shape = self.cache_shape(shape, args)
        dtype = self.cache_dtype_bytes(args, shape)
        pool = self.pool(args, tokens=tokens, sequences=sequences, card_memory_bytes=0)
        return sum(layer_bytes_on_card(shape, pool, tp=tp, dtype=dtype)) * tp

    def card_need(self, shape: ModelShape, asked: SizingRequest) -> CardNeed:
        """A card's share of the weights and of its pipeline stage's KV, plus the engine's
        overhead, against its budget (`overhead_and_budget`); the KV pool the engine
        allocates there (the budget less the rest), its tokens and requests of `tokens`."""
        return self.need_plan(shape, asked).at(asked.tokens, asked.args)

    def need_plan(self, shape: ModelShape, asked: SizingRequest) -> NeedPlan:
        """`card_need` for what `asked` says less its context (the arguments' context value
        and `tokens` are read by `NeedPlan.at`): what no context changes worked out here."""
        args, cards = asked.args, asked.cards
        card_memory_bytes = asked.card_memory_bytes
        shape = self.cache_shape(shape, args)
        card = asked.card or CardTotals.of("", card_memory_bytes)
        # The arguments less the context's value: the key of what no context changes.
        masked = _without_value(args, self.context_flag)
        tp, pp, dtype, template, offloaded = self._setting(
            shape, args, masked, cards, card.cuda_bytes or card_memory_bytes
        )
        plan = object.__new__(NeedPlan)
        plan.__dict__.update(
            engine=self,
            shape=shape,
            masked=masked,
            sequences=max(asked.slots, 1),
            tp=tp,
            pp=pp,
            dtype=dtype,
            template=template,
            weights_card=-(-shape.weights_bytes // (tp * pp)) - offloaded,
            card=card,
            known=card.nvml_bytes > 0 or card.cuda_bytes > 0,
            engine_version=asked.engine_version,
            overheads=self._overheads(args, masked, shape, tp, pp, card, asked.engine_version),
            layers=layer_costs(shape, tp, dtype),
            stages=stage_counts(shape, pp),
        )
        return plan

    def _overheads(
        self,
        args: Sequence[str],
        masked: tuple[str, ...],
        shape: ModelShape,
        tp: int,
        pp: int,
        card: CardTotals,
        engine_version: str,
    ) -> _Overheads:
        """One setting's kept overheads (`_overhead`), made empty on its first use: kept per
        shape and setting (the arguments less the context flag's value, the card, the
        version; bounded, SETTINGS_KEPT settings)."""
        setting = (self.name, masked, tp, pp, card, engine_version)
        kept = memo_table(shape, "tp_overheads")
        entry: _Overheads | None = kept.get(setting)
        if entry is None:
            entry = kept[setting] = (
                self.overhead_tokens(args, card=card, engine_version=engine_version),
                OrderedDict(),
                self.margin_widener(args, card=card, engine_version=engine_version),
                OrderedDict(),
            )
            while len(kept) > SETTINGS_KEPT:
                kept.popitem(last=False)
        else:
            kept.move_to_end(setting)
        return entry

    def _overhead(
        self,
        entry: _Overheads,
        shape: ModelShape,
        args: Sequence[str],
        tokens: int,
        tp: int,
        pp: int,
        weights_card: int,
        card: CardTotals,
        engine_version: str,
    ) -> tuple[Overhead, int, int]:
        """The overhead (`overhead_and_budget`), the KV pool's bytes on a card and the tokens it
        holds (`token_capacity`), from the setting's kept overheads `entry` (`_overheads`).
        Where the engine says which part of the context its central figures read
        (`overhead_tokens`), all three are kept under that part: a context never asked before
        then costs a look-up, not the engine's rules (bounded: OVERHEADS_PER_SETTING parts),
        and, where the engine widens the margin by the context (`margin_widener`), that
        widening."""
        part_of, figures, widening, widened = entry
        part = part_of(tokens) if part_of is not None else None
        found = figures.get(part) if part_of is not None else None
        if found is not None:
            figures.move_to_end(part)
        else:
            over = self.central_overhead(
                shape,
                args,
                tokens=tokens,
                tp=tp,
                pp=pp,
                weights_card_bytes=weights_card,
                card=card,
                engine_version=engine_version,
            )
            known = card.nvml_bytes > 0 or card.cuda_bytes > 0
            budget = over.budget_bytes if known else 0
            pool_bytes = max(budget - weights_card - over.total_bytes, 0) if budget else 0
            capacity = self.token_capacity(shape, available_kv_bytes=pool_bytes, tp=tp, args=args)
            found = (over, pool_bytes, capacity)
            if part_of is not None:
                figures[part] = found
                while len(figures) > OVERHEADS_PER_SETTING:
                    figures.popitem(last=False)
        if widening is None:
            return found
        # The margin is not in the pool's bytes or its tokens (`total_bytes` leaves it out), so
        # only the overhead is widened, and kept under both parts of the context it read.
        margin_part, widen = widening
        key = (part, margin_part(tokens)) if part_of is not None else None
        hit = widened.get(key) if key is not None else None
        if hit is not None:
            widened.move_to_end(key)
            return hit
        out = widen(shape, args, found[0], tokens, tp, pp, card), found[1], found[2]
        if key is not None:
            widened[key] = out
            while len(widened) > OVERHEADS_PER_SETTING:
                widened.popitem(last=False)
        return out

    def overhead_tokens(
        self, args: Sequence[str], *, card: CardTotals, engine_version: str
    ) -> Callable[[int], Hashable] | None:
        """What of a context `central_overhead` and `token_capacity` read under `args` on
        `card` at `engine_version` (whatever the context flag's value): a function of the
        tokens whose equal answers mean equal figures, worked out once per setting; None
        (here) when they may read all of it, so nothing is kept."""
        return None

    def central_overhead(
        self,
        shape: ModelShape,
        args: Sequence[str],
        *,
        tokens: int,
        tp: int,
        pp: int,
        weights_card_bytes: int,
        card: CardTotals,
        engine_version: str,
    ) -> Overhead:
        """`overhead_and_budget` before `margin_widener`'s widening (here: all of it)."""
        return self.overhead_and_budget(
            shape,
            args,
            tokens=tokens,
            tp=tp,
            pp=pp,
            weights_card_bytes=weights_card_bytes,
            card=card,
            engine_version=engine_version,
        )

    def margin_widener(
        self, args: Sequence[str], *, card: CardTotals, engine_version: str
    ) -> tuple[Callable[[int], Hashable], MarginWidener] | None:
        """How `overhead_and_budget` widens `central_overhead`'s margin by the context under
        `args` on `card` at `engine_version`, worked out once per setting: what of a context
        the widening reads (as `overhead_tokens` says it of the central figures), and the
        widening; None (here) when it does not."""
        return None

    def _setting(
        self,
        shape: ModelShape,
        args: Sequence[str],
        masked: tuple[str, ...],
        cards: int,
        card_memory_bytes: int,
    ) -> tuple[int, int, Fraction, CachePool, int]:
        """The (tp, pp) sizes, the cache type's bytes, the pool's layout (for no tokens yet)
        and the weights each card keeps in host memory (`offloaded_per_card`) of `args` on
        `cards` cards: none of them depends on the context, so they are worked out once per
        shape and setting and kept in its `sizing_memo` (`engines.memo`; bounded,
        SETTINGS_KEPT) under the arguments less the context flag's value."""
        key = (self.name, masked, cards, card_memory_bytes)
        kept = memo_table(shape, "tp_settings")
        hit = kept.get(key)
        if hit is not None:
            kept.move_to_end(key)
            return hit  # type: ignore[no-any-return]
        tp, pp = self.tensor_parallel(args, cards)
        dtype = self.cache_dtype_bytes(args, shape)
        template = self.pool(args, tokens=0, sequences=1, card_memory_bytes=card_memory_bytes)
        setting = (tp, pp, dtype, template, self.offloaded_per_card(shape, args, tp, pp))
        kept[key] = setting
        while len(kept) > SETTINGS_KEPT:
            kept.popitem(last=False)
        return setting

    # --- what each engine writes ------------------------------------------------------------

    def offloaded_per_card(self, shape: ModelShape, args: Sequence[str], tp: int, pp: int) -> int:
        """The weights each card keeps in host memory rather than on the card (none here)."""
        return 0

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> CachePool:
        """The engine's cache pool for `tokens` over `sequences` (`card_memory_bytes` for
        defaults that depend on the card; 0 takes the larger card's)."""
        raise NotImplementedError

    def overhead_and_budget(
        self,
        shape: ModelShape,
        args: Sequence[str],
        *,
        tokens: int,
        tp: int,
        pp: int,
        weights_card_bytes: int,
        card: CardTotals,
        engine_version: str,
    ) -> Overhead:
        """What a card needs beside weights and KV, and what it may use of the card."""
        raise NotImplementedError

    def token_capacity(
        self, shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
    ) -> int:
        """The tokens the engine's KV pool holds in `available_kv_bytes` on each card: whole
        tokens at every KV layer's full width (engines with pages round further)."""
        per_token = token_bytes_on_card(shape, tp, self.cache_dtype_bytes(args, shape))
        if available_kv_bytes <= 0 or per_token <= 0:
            return 0
        return available_kv_bytes // per_token


class NeedPlan:
    """A tensor-parallel engine's `card_need` for one shape and setting (the arguments less
    the context's value, the card count, the card, the version, the sequences), for any
    context: `at` does only what the context changes (`TensorParallelEngine.need_plan`)."""

    engine: TensorParallelEngine
    shape: ModelShape
    masked: tuple[str, ...]
    sequences: int
    tp: int
    pp: int
    dtype: Fraction
    template: CachePool
    weights_card: int
    card: CardTotals
    known: bool
    engine_version: str
    overheads: _Overheads
    layers: tuple[tuple[Layer, int, int, int], ...]
    """Per distinct layer: the layer, a token's bytes on a card as num / den, and its
    recurrent state on a card (`kvcache.layer_costs`)."""
    stages: tuple[tuple[int, ...], ...]
    """Per pipeline stage, its layers of each distinct geometry (`kvcache.stage_counts`)."""

    def at(self, tokens: int, args: Sequence[str]) -> CardNeed:
        """The need at `tokens` of context, `args` being the setting's arguments with the
        context's value written for `tokens`."""
        sequences, tp, pp, card = self.sequences, self.tp, self.pp, self.card
        shape, weights_card, known = self.shape, self.weights_card, self.known
        # A copy of the template without dataclasses.replace's __init__ (a pool checks nothing
        # there), as Profile.with_args copies a profile.
        template = self.template
        pool = object.__new__(type(template))
        pool.__dict__.update(template.__dict__, tokens=tokens * sequences, sequences=sequences)
        held = pool.held
        sized = [
            (-(-held(layer) * num // den) if num else 0) + sequences * state
            for layer, num, den, state in self.layers
        ]
        if len(self.stages) == 1:
            kv_sum = kv_card = sum(map(operator.mul, self.stages[0], sized))
        else:
            per_stage = [sum(map(operator.mul, row, sized)) for row in self.stages]
            kv_sum, kv_card = sum(per_stage), max(per_stage)
        over, pool_bytes, capacity = self.engine._overhead(
            self.overheads, shape, args, tokens, tp, pp, weights_card, card, self.engine_version
        )
        budget = over.budget_bytes if known else 0
        return made(
            CardNeed,
            weights_bytes=shape.weights_bytes,
            kv_bytes=kv_sum * tp,
            per_card_bytes=weights_card + kv_card + over.total_bytes,
            overhead_bytes=over.total_bytes,
            budget_bytes=budget,
            cards=tp * pp,
            weights_per_card_bytes=weights_card,
            kv_per_card_bytes=kv_card,
            activation_bytes=over.activation_bytes,
            non_torch_bytes=over.non_torch_bytes,
            cuda_graph_bytes=over.cuda_graph_bytes,
            other_bytes=over.other_bytes,
            kv_pool_bytes=pool_bytes,
            kv_token_capacity=capacity,
            max_concurrency=capacity / tokens if tokens > 0 else 0.0,
            margin_bytes=over.margin_bytes,
            rules=over.rules,
            card_total_bytes=over.card_total_bytes,
            outside_bytes=over.outside_bytes if known else 0,
            outside_room_bytes=over.outside_room_bytes if known else 0,
            outside_margin_bytes=over.outside_margin_bytes,
            weights_known=shape.weights_bytes > 0,
            devices=(),
        )


SETTINGS_KEPT = 32
"""Settings (argument lists × card counts × card sizes) kept per shape."""

MarginWidener = Callable[[ModelShape, Sequence[str], Overhead, int, int, int, CardTotals], Overhead]
"""(shape, args, central overhead, tokens, tp, pp, card) -> the overhead, its margin widened
by what the context moves of it (`TensorParallelEngine.margin_widener`)."""

_Overheads = tuple[
    Callable[[int], Hashable] | None,
    OrderedDict[Hashable, tuple[Overhead, int, int]],
    tuple[Callable[[int], Hashable], MarginWidener] | None,
    OrderedDict[Hashable, tuple[Overhead, int, int]],
]
"""One setting's kept overheads: what of a context their central figures read, the figures
by it, what of a context the margin's widening reads and the widening, and the widened
figures by both parts."""

OVERHEADS_PER_SETTING = 16
"""Overheads kept per setting: one where the context changes none of it, else the last few
parts of a context that do (`overhead_tokens`)."""


def _without_value(args: Sequence[str], flag: Flag) -> tuple[str, ...]:
    """`args` with the value of `flag` left out where it is spelled as one of its names
    (`--name N` or `--name=N`); any other spelling stays, and only misses the memo."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in flag and i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = ""
        elif "=" in arg and arg.split("=", 1)[0] in flag:
            out[i] = arg.split("=", 1)[0] + "="
    return tuple(out)
