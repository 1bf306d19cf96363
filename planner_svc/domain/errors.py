"""The planner's exceptions: one root, leaves that carry the numbers of a refusal."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.engines.errors import EngineError as EngineError
from llmgw.engines.errors import EngineRefuses as EngineRefuses
from llmgw.engines.errors import EngineSingleCard as EngineSingleCard
from llmgw.engines.errors import UnknownEngine as UnknownEngine
from llmgw.model import InvalidValue as InvalidValue
from llmgw.refusal import Refusal

# The engines' refusals (unknown engine, settings an engine refuses, one card only) are
# llmgw.engines'; the planner raises them as its own.
# The shape refusal is the contract's (llmgw.shape), raised by the planner's readers too.
from llmgw.shape import InvalidShape as InvalidShape


@dataclass
class PlannerError(Refusal):
    """Root of every refusal the planner makes."""


@dataclass
class SourceUnreachable(PlannerError):
    """A source could not be fetched (network, missing file, HTTP error)."""

    source: str = ""

    def metadata(self) -> dict[str, str]:
        return {"source": self.source} if self.source else {}


@dataclass
class InvalidRequest(PlannerError, InvalidValue):
    """A planner request field is out of range; `field` names it for `BadRequest`."""


@dataclass
class ContextTooShort(InvalidRequest):
    """tokens < 256."""

    tokens: int = 0
    field: str = "tokens"
    reason: str = "CONTEXT_TOO_SHORT"

    def metadata(self) -> dict[str, str]:
        return {"tokens": str(self.tokens), "minimum": "256"}


@dataclass
class SlotsOutOfRange(InvalidRequest):
    """slots not in 1..64 (0 keeps the current)."""

    slots: int = 0
    field: str = "slots"
    reason: str = "SLOTS_OUT_OF_RANGE"

    def metadata(self) -> dict[str, str]:
        return {"slots": str(self.slots), "minimum": "1", "maximum": "64"}


@dataclass
class ContextOverLimit(InvalidRequest):
    """tokens past any model's context (`context.MAX_TOKENS`): a typo, not a plan."""

    tokens: int = 0
    maximum: int = 0
    field: str = "tokens"
    reason: str = "CONTEXT_OVER_LIMIT"

    def metadata(self) -> dict[str, str]:
        return {"tokens": str(self.tokens), "maximum": str(self.maximum)}


@dataclass
class GPUCountOutOfRange(InvalidRequest):
    """A card count per replica below 1 or past `gpus.MAX_GPUS`."""

    gpus: int = 0
    maximum: int = 0
    field: str = "gpus"
    reason: str = "GPU_COUNT_OUT_OF_RANGE"

    def metadata(self) -> dict[str, str]:
        return {"gpus": str(self.gpus), "minimum": "1", "maximum": str(self.maximum)}


@dataclass
class ProfileOnCPU(InvalidRequest):
    """PlanGPUs names a profile that runs in RAM (cpu_only, or no gpu_class)."""

    profile: str = ""
    field: str = "profile"
    reason: str = "PROFILE_ON_CPU"

    def metadata(self) -> dict[str, str]:
        return {"profile": self.profile}


@dataclass
class NoGPUProfile(InvalidRequest):
    """PlanGPUs names no profile, and the model has no GPU profile to plan."""

    model: str = ""
    field: str = "profile"
    reason: str = "NO_GPU_PROFILE"

    def metadata(self) -> dict[str, str]:
        return {"model": self.model}


@dataclass
class MemoryOutOfRange(InvalidRequest):
    """A profile's memory need is past what any machine holds (`context.MAX_NEED_BYTES`): the
    shape or the context is absurd, and the numbers would not fit the contract's fields."""

    profile: str = ""
    need_bytes: int = 0
    maximum_bytes: int = 0
    field: str = "model.shape"
    reason: str = "MEMORY_OUT_OF_RANGE"

    def metadata(self) -> dict[str, str]:
        return {
            "profile": self.profile,
            "need_bytes": str(self.need_bytes),
            "maximum_bytes": str(self.maximum_bytes),
        }


@dataclass
class ContextOverTrained(PlannerError):
    """tokens > the context the model was trained for."""

    tokens: int = 0
    trained: int = 0

    def metadata(self) -> dict[str, str]:
        return {"tokens": str(self.tokens), "trained": str(self.trained)}


@dataclass
class EngineNoContext(PlannerError):
    """A profile's engine does not take a context this way."""

    profile: str = ""
    engine: str = ""

    def metadata(self) -> dict[str, str]:
        return {"profile": self.profile, "engine": self.engine}


@dataclass
class CardsTooSmall(PlannerError):
    """Weights + context exceed what the profile's cards hold."""

    profile: str = ""
    need_bytes: int = 0
    budget_bytes: int = 0
    cards: int = 0
    longest_context_tokens: int = 0
    fewest_cards: int = 0

    def metadata(self) -> dict[str, str]:
        return {
            "profile": self.profile,
            "need_bytes": str(self.need_bytes),
            "budget_bytes": str(self.budget_bytes),
            "cards": str(self.cards),
            "longest_context_tokens": str(self.longest_context_tokens),
            "fewest_cards": str(self.fewest_cards),
        }


@dataclass
class GPUCountUnavailable(PlannerError):
    """No node of the profile's class has that many cards."""

    profile: str = ""
    gpu_class: str = ""
    gpus: int = 0
    largest: int = 0

    def metadata(self) -> dict[str, str]:
        return {
            "profile": self.profile,
            "gpu_class": self.gpu_class,
            "gpus": str(self.gpus),
            "largest": str(self.largest),
        }


@dataclass
class HeadsNotDivisible(PlannerError):
    """Tensor parallel N fails one of the divisibility checks the engine makes at load (heads,
    KV heads, MLP and expert widths, vision encoder, quantized shards: `engines.heads`);
    `check` says which, `valid_counts` every count that passes them all."""

    gpus: int = 0
    attention_heads: int = 0
    kv_heads: int = 0
    valid_counts: tuple[int, ...] = field(default_factory=tuple)
    check: str = ""

    def metadata(self) -> dict[str, str]:
        out = {
            "gpus": str(self.gpus),
            "attention_heads": str(self.attention_heads),
            "kv_heads": str(self.kv_heads),
            "valid_counts": ",".join(str(n) for n in self.valid_counts),
        }
        if self.check:
            out["check"] = self.check
        return out


@dataclass
class ProfileNotFound(PlannerError):
    """The request names a profile the model does not have."""

    profile: str = ""

    def metadata(self) -> dict[str, str]:
        return {"profile": self.profile}


@dataclass
class FetchLimitExceeded(InvalidRequest):
    """Resolving a source would fetch more bytes or files, read more header items, or take
    longer than one resolution's budget (`sources.budget.FetchLimits`); `limit` names the
    budget, `maximum` its value, `count` what the source asked for (at least)."""

    source: str = ""
    limit: str = ""
    maximum: int = 0
    count: int = 0
    field: str = "model.source"
    reason: str = "LIMIT_EXCEEDED"

    def metadata(self) -> dict[str, str]:
        return {
            "field": self.field,
            "limit": self.limit,
            "maximum": str(self.maximum),
            "count": str(self.count),
            "source": self.source,
        }


@dataclass
class ResolutionsBusy(PlannerError):
    """As many resolutions as allowed are already fetching, for this caller (`scope`
    "identity") or in all (`scope` "total"); a retry after `retry_after_s` may be let in."""

    limit: str = ""
    maximum: int = 0
    scope: str = ""
    retry_after_s: float = 1.0

    def metadata(self) -> dict[str, str]:
        return {"limit": self.limit, "maximum": str(self.maximum), "scope": self.scope}
