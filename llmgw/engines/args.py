"""Engine arguments: read, set and drop flags written `--flag value` or `--flag=value`, under
any of their aliases and, for engines that read `_` as `-`, either spelling."""

from __future__ import annotations

import functools
from collections.abc import Sequence


def fold(flag: str) -> str:
    """A long flag with `_` written as `-` (how vLLM's FlexibleArgumentParser and llama.cpp's
    common/arg.cpp read `--a_b`); a short flag or a value as it is."""
    return flag.replace("_", "-") if flag.startswith("--") else flag


def split_flag(arg: str) -> tuple[str, str | None]:
    """The flag an argument names and its inline value: `--a=b` -> ("--a", "b"), `--a` ->
    ("--a", None). A value (not starting with "-") is returned whole with no inline value."""
    if arg.startswith("-") and "=" in arg:
        name, value = arg.split("=", 1)
        return name, value
    return arg, None


def _wanted(names: Sequence[str], folded: bool) -> frozenset[str]:
    """The spellings `_matches` compares against: the names, folded when the engine folds."""
    return frozenset(fold(n) for n in names) if folded else frozenset(names)


def _matches(arg: str, wanted: frozenset[str], folded: bool) -> tuple[bool, str | None]:
    """Whether `arg` is one of the flags `wanted` (from `_wanted`); the inline value when
    written `--flag=value`."""
    flag, inline = split_flag(arg)
    return (fold(flag) if folded else flag) in wanted, inline


def get_arg(args: Sequence[str], names: Sequence[str], *, folded: bool = False) -> str | None:
    """The value of the last occurrence of a flag under any of its `names`, None when absent.

    Args:
        args: the engine's arguments.
        names: the flag and its aliases, e.g. ("--ctx-size", "-c").
        folded: whether `--a_b` is the same flag as `--a-b` (the engine reads them alike).
    Returns:
        The value as written; "" for a flag given last with no value.
    """
    if len(args) > _REMEMBERED_ARGS or sum(map(len, args)) > _REMEMBERED_CHARS:
        return _find_arg(tuple(args), tuple(names), folded)
    return _remembered_arg(tuple(args), tuple(names), folded)


# Sizing one request reads the same profile's flags some twenty times (context, tensor
# parallel, dtypes, utilisation, for the profile before and after), so lookups are remembered:
# at most 4,096 of them, each for an argument list of at most 64 arguments and 4 KiB, so the
# memory held stays bounded whatever requests arrive (a longer list is read every time).
_REMEMBERED_ARGS = 64
_REMEMBERED_CHARS = 4096


def _find_arg(args: tuple[str, ...], names: tuple[str, ...], folded: bool) -> str | None:
    """`get_arg` itself: a scan of the arguments."""
    wanted = _wanted(names, folded)
    value: str | None = None
    i = 0
    while i < len(args):
        hit, inline = _matches(args[i], wanted, folded)
        if hit:
            if inline is not None:
                value = inline
            elif i + 1 < len(args) and not is_flag(args[i + 1]):
                value = args[i + 1]
                i += 1
            else:
                value = ""
        i += 1
    return value


_remembered_arg = functools.lru_cache(maxsize=4096)(_find_arg)


def has_flag(args: Sequence[str], names: Sequence[str], *, folded: bool = False) -> bool:
    """Whether any of the flag `names` is present (as a switch or with a value)."""
    wanted = _wanted(names, folded)
    return any(_matches(a, wanted, folded)[0] for a in args)


def get_int(
    args: Sequence[str], names: Sequence[str], default: int = 0, *, folded: bool = False
) -> int:
    """A flag's whole-number value; `default` when absent or not a whole number."""
    value = get_arg(args, names, folded=folded)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def set_arg(
    args: Sequence[str],
    names: Sequence[str],
    value: str,
    *,
    joined_ok: bool = True,
    folded: bool = False,
) -> list[str]:
    """Arguments with a flag set to `value`: its first occurrence (under any alias or
    spelling) is replaced in the form it was written, later ones are dropped, and an absent
    flag is appended under its first name.

    Args:
        joined_ok: whether the engine parses `--flag=value`; when not (llama-server's parser
            has no `=` split), the flag is always written `--flag value`.
        folded: whether the engine reads `--a_b` as `--a-b` (then either spelling is the flag).
    """
    wanted = _wanted(names, folded)
    out: list[str] = []
    done = False
    i = 0
    while i < len(args):
        hit, inline = _matches(args[i], wanted, folded)
        if not hit:
            out.append(args[i])
            i += 1
            continue
        takes_next = inline is None and i + 1 < len(args) and not is_flag(args[i + 1])
        if not done:
            flag = split_flag(args[i])[0]
            joined = inline is not None and joined_ok
            out.extend([f"{flag}={value}"] if joined else [flag, value])
            done = True
        i += 2 if takes_next else 1
    if not done:
        out.extend([names[0], value])
    return out


def drop_arg(
    args: Sequence[str], names: Sequence[str], takes_value: bool = True, *, folded: bool = False
) -> list[str]:
    """Arguments without a flag (every occurrence, under any alias, with its value)."""
    wanted = _wanted(names, folded)
    out: list[str] = []
    i = 0
    while i < len(args):
        hit, inline = _matches(args[i], wanted, folded)
        if not hit:
            out.append(args[i])
            i += 1
            continue
        skip_next = (
            takes_value and inline is None and i + 1 < len(args) and not is_flag(args[i + 1])
        )
        i += 2 if skip_next else 1
    return out


def is_flag(arg: str) -> bool:
    """Whether an argument is a flag rather than a value (negative numbers are values)."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False
