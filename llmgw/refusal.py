"""The root of every refusal an llmgw service makes: a sentence a person can act on, and
the facts behind it for `google.rpc.ErrorInfo`. Pure: no grpc, no I/O."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Refusal(Exception):
    """A refusal; `message` is one sentence saying what was refused, why, and what would work."""

    message: str

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def metadata(self) -> dict[str, str]:
        """The refusal's facts (numbers as strings), for `google.rpc.ErrorInfo`."""
        return {}
