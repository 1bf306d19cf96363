"""One-card engines: servers that run a model on a single card and take no context through
their arguments. Hugging Face text-embeddings-inference (`tei`) and `infinity` serve
embeddings and rerankers this way in llmgw catalogs; `embeddings` names such a server
generically."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from llmgw.cardclass import GIB
from llmgw.engines.base import CardNeed, CardSplit, SizingRequest
from llmgw.engines.errors import EngineSingleCard
from llmgw.engines.gang import EngineSingleNode, GangLaunch, GangMember
from llmgw.engines.grammar import Grammar, RefusedFlag
from llmgw.shape import ModelShape

SINGLE_CARD_RESERVE_BYTES = GIB
"""What an embeddings server's card keeps for the CUDA context and runtime (gt-049: 0.86 GiB
in use before loading); rounded up."""


class OneCardEngine:
    """A server on one card: its weights, no KV cache the planner sizes, no context flag."""

    split = CardSplit.SINGLE_CARD
    aliases: tuple[str, ...] = ()
    default_utilisation: float | None = None
    refused_flags: tuple[RefusedFlag, ...] | None = None

    def __init__(self, name: str, api_dialect: str = "openai") -> None:
        self.name = name
        self.api_dialect = api_dialect
        self.grammar = Grammar(name)

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """None: a one-card server runs on one node.

        Raises:
            EngineSingleNode: always.
        """
        raise EngineSingleNode(
            f"{self.name} runs on one card of one node: serve more replicas instead",
            engine=self.name,
            nodes=member.nnodes,
        )

    @property
    def takes_context(self) -> bool:
        """Never."""
        return False

    @property
    def single_card(self) -> bool:
        """Always."""
        return True

    @property
    def splits_by_heads(self) -> bool:
        """Never."""
        return False

    def context_tokens(self, args: Sequence[str]) -> int:
        """Not in its arguments: 0."""
        return 0

    def slots(self, args: Sequence[str]) -> int:
        """One."""
        return 1

    def pool_tokens(self, tokens: int, slots: int) -> int:
        """One request's tokens."""
        return tokens

    def with_context(self, args: Sequence[str], tokens: int, slots: int) -> list[str]:
        """The arguments as they are: no flag sets a context."""
        return list(args)

    def with_cards(self, args: Sequence[str], cards: int) -> list[str]:
        """The arguments as they are: there is no card flag."""
        return list(args)

    def card_counts(
        self, shape: ModelShape | None, largest: int, args: Sequence[str] = ()
    ) -> list[int]:
        """One card."""
        return [1]

    def splits_heads(self, cards: int, shape: ModelShape, args: Sequence[str] = ()) -> bool:
        """Heads are not split."""
        return True

    def replica_tp(self, cards: int, current: int) -> int:
        """The profile's own."""
        return current

    def tensor_parallel(self, args: Sequence[str], cards: int) -> tuple[int, int]:
        """No parallel flags: the cards, one stage."""
        return cards or 1, 1

    def cache_dtype_bytes(self, args: Sequence[str], shape: ModelShape) -> Fraction:
        """The model's dtype."""
        return Fraction(shape.kv_dtype_bytes)

    def kv_cache_bytes(
        self, shape: ModelShape, *, tokens: int, sequences: int, tp: int, args: Sequence[str]
    ) -> int:
        """None kept."""
        return 0

    def card_need(self, shape: ModelShape, asked: SizingRequest) -> CardNeed:
        """Its weights on one card, against the card less `SINGLE_CARD_RESERVE_BYTES`.

        Raises:
            EngineSingleCard: more than one card.
        """
        cards, total = asked.cards, asked.card_memory_bytes
        if cards > 1:
            raise EngineSingleCard(
                f"{self.name} runs on one card only, not {cards}: serve it on one",
                engine=self.name,
            )
        budget = max(total - SINGLE_CARD_RESERVE_BYTES, 1) if total else 0
        w = shape.weights_bytes
        return CardNeed(
            w,
            0,
            w,
            0,
            budget,
            1,
            weights_per_card_bytes=w,
            weights_known=w > 0,
            card_total_bytes=total,
            rules=f"{self.name}: the card less {SINGLE_CARD_RESERVE_BYTES >> 20} MiB",
        )


# text-embeddings-inference's router serves /embed and /rerank beside /v1/embeddings.
TEI = OneCardEngine("tei", api_dialect="tei")
INFINITY = OneCardEngine("infinity")
EMBEDDINGS = OneCardEngine("embeddings")
