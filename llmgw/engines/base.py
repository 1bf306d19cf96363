"""The engine protocol: what the planner and the node agent ask of an engine, whatever it is."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from llmgw.cardclass import cuda_total
from llmgw.engines.gang import GangLaunch, GangMember
from llmgw.engines.grammar import Grammar, RefusedFlag
from llmgw.shape import ModelShape


class CardSplit(enum.Enum):
    """How an engine spreads one replica over several cards."""

    TENSOR_PARALLEL = "tensor_parallel"
    """Every layer split across the cards by heads (vLLM, SGLang, TensorRT-LLM)."""
    LAYER_SPLIT = "layer_split"
    """Whole layers placed on each card in turn (llama.cpp `--split-mode layer`)."""
    SINGLE_CARD = "single_card"
    """The engine runs on one card only (embedding servers)."""


class Verdict(enum.Enum):
    """Whether a replica fits its cards, given the figures' margin."""

    FITS = "fits"
    """It fits even if every fitted figure is at the far end of its margin."""
    WITHIN_MARGIN = "fits only within the margin"
    """The central figures fit, their margin would not: it could go either way."""
    DOES_NOT_FIT = "does not fit"
    """The central figures do not fit."""
    NOT_CHECKED = "not checked"
    """The card's memory (or the weights) is not known."""


@dataclass(frozen=True)
class CardTotals:
    """A card's totals as the engines size against them: NVML's total, CUDA's total (what
    torch sees) with its source and margin, and the class name (vLLM's defaults look at it).
    0: not known. Not a node's card as its agent reports it (that is `llmgw.card.Card`)."""

    name: str = ""
    nvml_bytes: int = 0
    cuda_bytes: int = 0
    cuda_source: str = ""
    cuda_margin_bytes: int = 0

    @staticmethod
    def of(name: str, nvml_bytes: int, reported_cuda_bytes: int = 0) -> CardTotals:
        """A card of class `name` with NVML total `nvml_bytes`; its CUDA total as reported,
        logged for the class, or derived (`llmgw.cardclass.cuda_total`)."""
        total = cuda_total(name, nvml_bytes, reported_cuda_bytes)
        return CardTotals(name, nvml_bytes, total.bytes, total.source, total.margin_bytes)


@dataclass(frozen=True)
class SizingRequest:
    """What a card need is asked for: a replica served with `args` (already set for this
    context and card count), `tokens` of context per request, `slots` requests held at full
    length at once (llama.cpp's `--parallel`; 1 elsewhere), on `cards` cards (0: from the
    arguments) of `card_memory_bytes` each as NVML reports it (0: not known, budget 0).
    `card` carries both of the card's totals (None: CUDA's derived from `card_memory_bytes`);
    `engine_version` is the version whose rules apply ("": the newest known). The numbers are
    validated by `planner_svc.domain.memory.card_need` before an engine sees them."""

    args: tuple[str, ...]
    tokens: int
    slots: int
    cards: int
    card_memory_bytes: int
    card: CardTotals | None = None
    engine_version: str = ""


@dataclass(frozen=True)
class Overhead:
    """What an engine keeps on a card beside weights and KV, the budget it sizes against, and
    the rules it applied.

    `activation_bytes`, `non_torch_bytes`, `cuda_graph_bytes` and `other_bytes` are inside the
    budget; `outside_bytes` is what the engine also needs on the card but outside its budget
    (vLLM captures its CUDA graphs there), against `outside_room_bytes`, uncertain by
    `outside_margin_bytes`.
    `margin_bytes` is how far these figures may be off (they rest on fitted constants).
    """

    budget_bytes: int
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    cuda_graph_bytes: int = 0
    other_bytes: int = 0
    outside_bytes: int = 0
    outside_room_bytes: int = 0
    margin_bytes: int = 0
    rules: str = ""
    card_total_bytes: int = 0
    outside_margin_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything inside the budget that is not weights or KV."""
        return (
            self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes + self.other_bytes
        )


@dataclass(frozen=True)
class DevicePlacement:
    """What an engine that places whole layers puts on one device (llama.cpp): `device` is
    "GPU0", "GPU1", ... or "CPU" for what is not offloaded; `first_layer`..`last_layer` the
    repeating layers it holds (`layers` 0: none), `output` whether the output layer is there."""

    device: str
    layers: int
    first_layer: int
    last_layer: int
    output: bool
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int


@dataclass(frozen=True)
class CardNeed:
    """What one replica needs on its cards and what the fullest card may use.

    `weights_bytes` and `kv_bytes` are the whole replica's; `per_card_bytes` is the fullest
    card's share of weights and KV plus `overhead_bytes` (activations, CUDA graphs, runtime),
    to compare with `budget_bytes` (0 when the card's memory is not known).

    The breakdown on the fullest card: `weights_per_card_bytes`, `kv_per_card_bytes` (what the
    asked context needs), `activation_bytes`, `non_torch_bytes`, `cuda_graph_bytes`,
    `other_bytes`; `kv_pool_bytes` is the KV pool the engine allocates there (all of the
    budget left after the rest, for engines that size it so; else the need), holding
    `kv_token_capacity` tokens, `max_concurrency` requests of the asked context.
    `margin_bytes` is the uncertainty of the fitted figures; `rules` names the engine
    version's rules applied; `card_total_bytes` is the card total the budget starts from.
    """

    weights_bytes: int
    kv_bytes: int
    per_card_bytes: int
    overhead_bytes: int
    budget_bytes: int
    cards: int
    weights_per_card_bytes: int = 0
    kv_per_card_bytes: int = 0
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    cuda_graph_bytes: int = 0
    other_bytes: int = 0
    kv_pool_bytes: int = 0
    kv_token_capacity: int = 0
    max_concurrency: float = 0.0
    margin_bytes: int = 0
    rules: str = ""
    card_total_bytes: int = 0
    outside_bytes: int = 0
    outside_room_bytes: int = 0
    weights_known: bool = True
    outside_margin_bytes: int = 0
    devices: tuple[DevicePlacement, ...] = ()
    """Per device, for engines that place whole layers (empty for the others)."""

    @property
    def fits(self) -> bool:
        """Whether the fullest card holds it at the central figures (an unknown budget is
        taken as room)."""
        return self.budget_bytes <= 0 or (
            self.per_card_bytes <= self.budget_bytes
            and (self.outside_room_bytes <= 0 or self.outside_bytes <= self.outside_room_bytes)
        )

    @property
    def fits_with_margin(self) -> bool:
        """Whether it fits with every fitted figure at the far end of its margin."""
        if self.budget_bytes <= 0:
            return True
        outside_ok = self.outside_room_bytes <= 0 or (
            self.outside_bytes + self.outside_margin_bytes <= self.outside_room_bytes
        )
        return self.per_card_bytes + self.margin_bytes <= self.budget_bytes and outside_ok

    @property
    def verdict(self) -> Verdict:
        """Fits, fits only within the margin, does not fit, or not checked."""
        if self.budget_bytes <= 0 or not self.weights_known:
            return Verdict.NOT_CHECKED
        if not self.fits:
            return Verdict.DOES_NOT_FIT
        if not self.fits_with_margin:
            return Verdict.WITHIN_MARGIN
        return Verdict.FITS


class Engine(Protocol):
    """One engine: its flags, how a context and a card count are written into its arguments,
    its KV cache, overheads and budget on a card, and how it splits a model over cards.

    Arguments are the profile's, as the catalog holds them; numbers are validated by the
    caller (no negative tokens, slots or cards reach an engine). Methods raise
    `EngineRefuses` for arguments the engine itself would refuse.
    """

    @property
    def name(self) -> str:
        """The registry name (lower case)."""

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names the engine is known by (lower case), e.g. "llama.cpp"."""

    @property
    def grammar(self) -> Grammar:
        """How the engine's parser reads its arguments."""

    @property
    def split(self) -> CardSplit:
        """How a replica spreads over cards."""

    @property
    def default_utilisation(self) -> float | None:
        """The share of a card the engine budgets when no flag sets it; None when it derives
        it from the card (SGLang) or budgets none (llama.cpp, one-card engines)."""

    @property
    def refused_flags(self) -> tuple[RefusedFlag, ...] | None:
        """Flags the node agent refuses to pass (None: the agent does not run this engine)."""

    @property
    def api_dialect(self) -> str:
        """The HTTP API its server speaks, for the gateway: "openai" (OpenAI-compatible
        routes), "llamacpp" (llama-server's native routes beside those), "tei"."""

    @property
    def takes_context(self) -> bool:
        """Whether a context is set through the arguments."""

    @property
    def single_card(self) -> bool:
        """Whether a replica runs on one card only."""

    @property
    def splits_by_heads(self) -> bool:
        """Whether the card count must split the model's heads (tensor parallel)."""

    def context_tokens(self, args: Sequence[str]) -> int:
        """The context one request may use under `args`; 0 when they do not say."""

    def slots(self, args: Sequence[str]) -> int:
        """Requests served at full length at once under `args` (1 unless the engine has
        slots)."""

    def pool_tokens(self, tokens: int, slots: int) -> int:
        """The tokens one cache pool holds for `slots` requests of `tokens` each."""

    def with_context(self, args: Sequence[str], tokens: int, slots: int) -> list[str]:
        """`args` set for a context of `tokens` per request and `slots` requests, each flag
        rewritten where it stood, in the spelling it was written."""

    def with_cards(self, args: Sequence[str], cards: int) -> list[str]:
        """`args` set for a replica on `cards` cards, each flag rewritten where it stood."""

    def card_counts(
        self, shape: ModelShape | None, largest: int, args: Sequence[str] = ()
    ) -> list[int]:
        """The card counts from 1 to `largest` a replica may use (heads permitting) when
        served with `args` (which may lift a check, e.g. expert parallel)."""

    def splits_heads(self, cards: int, shape: ModelShape, args: Sequence[str] = ()) -> bool:
        """Whether `cards` cards split `shape`'s heads as the engine requires (always true
        for engines that do not split by heads)."""

    def replica_tp(self, cards: int, current: int) -> int:
        """The tensor parallel size a profile records for `cards` cards (`current` now)."""

    def tensor_parallel(self, args: Sequence[str], cards: int) -> tuple[int, int]:
        """The (tensor, pipeline) parallel sizes a replica on `cards` cards runs with
        (`cards` 0: the arguments decide)."""

    def cache_dtype_bytes(self, args: Sequence[str], shape: ModelShape) -> Fraction:
        """Bytes of one cached K or V element."""

    def kv_cache_bytes(
        self, shape: ModelShape, *, tokens: int, sequences: int, tp: int, args: Sequence[str]
    ) -> int:
        """The KV cache (and recurrent state) of a whole replica holding a pool of `tokens`
        shared by `sequences` requests, over `tp` cards."""

    def card_need(self, shape: ModelShape, asked: SizingRequest) -> CardNeed:
        """What a replica needs on each of its cards, and the fullest card's budget, for what
        `asked` says (`SizingRequest`).

        Raises:
            EngineRefuses, EngineSingleCard.
        """

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """How rank `member.rank` of a replica spanning `member.nnodes` nodes is started by
        the engine's own multi-node launch (`llmgw.engines.gang`), given the profile's
        `args`.

        Raises:
            EngineSingleNode: the engine cannot span nodes, or the member is no gang's.
        """
