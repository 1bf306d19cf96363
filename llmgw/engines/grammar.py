"""An engine's flag grammar: how its parser reads a command line (aliases, `--flag=value`,
`_` for `-`, abbreviations), and the reading and editing of its flags that follows from it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.engines import args as argv
from llmgw.engines.errors import EngineRefuses

Flag = tuple[str, ...]
"""A flag and its aliases as the engine's --help lists them; the first is written when the
flag is added."""


@dataclass(frozen=True)
class RefusedFlag:
    """A flag the node agent must not pass to an engine, and why.

    `only_paths`: refused only when its value names a file (contains a path separator), the
    flag being harmless with an inline value.
    """

    names: Flag
    why: str
    only_paths: bool = False


ADDRESS_FLAGS = RefusedFlag(
    ("--host", "--port", "--uds"),
    "the agent chooses the address the engine listens on",
)
"""Refused for every engine: the agent chooses the address an engine listens on (it health
checks it there and reports it to the fleet); a profile that moves it makes the replica
unreachable, or binds it to every interface."""


@dataclass(frozen=True)
class AllowedFlag:
    """A flag the node agent passes to an engine: it changes context, cards, memory, dtypes,
    caches, batching or logging, never what code runs or which weights load.

    `value`: the flag takes a value (the next argument, or `--flag=value`); False for a
    switch. A flag whose arity differs between engine versions is written as taking one (its
    next argument is then read as its value: lenient, never a false refusal)."""

    names: Flag
    value: bool = True


def switch(*names: str) -> AllowedFlag:
    """An allowed flag that takes no value."""
    return AllowedFlag(tuple(names), value=False)


@dataclass(frozen=True)
class Grammar:
    """How one engine's parser reads its arguments.

    `folds_underscores`: `--a_b` is read as `--a-b` (so both spellings are one flag);
    `joined_ok`: `--flag=value` is taken (llama-server's parser has no `=` split, so its
    flags are always written apart); `abbreviates`: an unambiguous prefix of a long flag is
    read as the flag (Python argparse's allow_abbrev).
    """

    engine: str
    folds_underscores: bool = False
    joined_ok: bool = True
    abbreviates: bool = False

    def get(self, args: Sequence[str], names: Flag) -> str | None:
        """The value of the flag's last occurrence (None when absent, "" when bare)."""
        return argv.get_arg(args, names, folded=self.folds_underscores)

    def has(self, args: Sequence[str], names: Flag) -> bool:
        """Whether the flag is present under any alias or spelling."""
        return argv.has_flag(args, names, folded=self.folds_underscores)

    def get_int(self, args: Sequence[str], names: Flag, default: int = 0) -> int:
        """The flag's whole-number value; `default` when absent or not a whole number."""
        return argv.get_int(args, names, default, folded=self.folds_underscores)

    def set(self, args: Sequence[str], names: Flag, value: str) -> list[str]:
        """The arguments with the flag set to `value` where it stood, in the spelling and
        form it was written (apart when the engine refuses `--flag=value`), never twice."""
        return argv.set_arg(
            args, names, value, joined_ok=self.joined_ok, folded=self.folds_underscores
        )

    def drop(self, args: Sequence[str], names: Flag) -> list[str]:
        """The arguments without the flag and its value, under every alias and spelling."""
        return argv.drop_arg(args, names, folded=self.folds_underscores)

    def normalise(self, flag: str) -> str:
        """A flag as the engine's parser names it (`_` as `-` where the engine folds)."""
        return argv.fold(flag) if self.folds_underscores else flag

    def refuse(self, message: str, detail: str) -> EngineRefuses:
        """This engine's refusal."""
        return EngineRefuses(message, engine=self.engine, detail=detail)

    def fraction(self, args: Sequence[str], names: Flag) -> float | None:
        """A fraction flag's value in (0, 1], None when absent.

        Raises:
            EngineRefuses: a value that is not such a number.
        """
        raw = self.get(args, names) if names else None
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not 0 < value <= 1:
            raise self.refuse(
                f"{self.engine} refuses {names[0]} {raw!r}: give a fraction above 0, at most 1",
                f"{names[0]}={raw}",
            )
        return value

    def count(self, args: Sequence[str], names: Flag, minimum: int = 1) -> int | None:
        """A whole-number flag's value (at least `minimum`), None when absent.

        Raises:
            EngineRefuses: a value that is not such a number.
        """
        raw = self.get(args, names) if names else None
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise self.refuse(
                f"{self.engine} refuses {names[0]} {raw!r}: give a whole number of at least "
                f"{minimum}",
                f"{names[0]}={raw}",
            )
        return value
