"""The refusals an engine makes: unknown engines, settings an engine would refuse, one-card
engines asked for more cards. The planner raises them as its own (planner_svc.domain.errors
re-exports them) and its status table maps them."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.refusal import Refusal


@dataclass
class EngineError(Refusal):
    """Root of the refusals of llmgw.engines."""


@dataclass
class UnknownEngine(EngineError):
    """No engine of that name is registered; `profile` names the profile that asked, when the
    caller knows it."""

    profile: str = ""
    engine: str = ""

    def metadata(self) -> dict[str, str]:
        return {"profile": self.profile, "engine": self.engine}


@dataclass
class EngineSingleCard(EngineError):
    """The engine runs on one card only."""

    profile: str = ""
    engine: str = ""

    def metadata(self) -> dict[str, str]:
        return {"profile": self.profile, "engine": self.engine}


@dataclass
class EngineRefuses(EngineError):
    """The engine itself would refuse these settings (e.g. a quantized llama.cpp cache
    whose head size is not a multiple of the type's block)."""

    engine: str = ""
    detail: str = ""

    def metadata(self) -> dict[str, str]:
        return {"engine": self.engine, "detail": self.detail}
