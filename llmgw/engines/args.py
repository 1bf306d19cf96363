"""Engine arguments: read, set and drop flags written `--flag value` or `--flag=value`, under
any of their aliases and, for engines that read `_` as `-`, either spelling."""

from __future__ import annotations

import functools
from collections import OrderedDict
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
    index = _index_of(args, folded)
    spelled = _spellings(tuple(names)) if folded else names
    if len(spelled) == 1:  # most flags have one name: one lookup
        hit = index.get(spelled[0])
        return None if hit is None else hit[1]
    last: tuple[int, str] | None = None
    for name in spelled:
        hit = index.get(name)
        if hit is not None and (last is None or hit[0] > last[0]):
            last = hit
    return None if last is None else last[1]


def has_flag(args: Sequence[str], names: Sequence[str], *, folded: bool = False) -> bool:
    """Whether any of the flag `names` is present (as a switch or with a value)."""
    index = _index_of(args, folded)
    return any(n in index for n in (_spellings(tuple(names)) if folded else names))


@functools.lru_cache(maxsize=512)
def _spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    """A flag's names folded (the engines' flag tables are constants: a few hundred at most;
    the bound keeps a caller's own names from growing it)."""
    return tuple(fold(n) for n in names)


FlagIndex = dict[str, tuple[int, str]]
"""Each flag an argument list names (folded where the engine folds) -> the position of its
last occurrence and the value written there ("" for a switch)."""


def _index(args: tuple[str, ...], folded: bool) -> FlagIndex:
    """One scan of the arguments: every flag's last occurrence and its value (its `=value`,
    else the next argument when that is not a flag, else ""). A value is indexed under its
    own text too; no flag name is a value, so lookups by flag never meet one."""
    index: FlagIndex = {}
    n = len(args)
    for i, arg in enumerate(args):
        flag, inline = split_flag(arg)
        if inline is None:
            inline = args[i + 1] if i + 1 < n and not is_flag(args[i + 1]) else ""
        index[fold(flag) if folded else flag] = (i, inline)
    return index


# Sizing one request reads the same profile's flags some twenty times (context, tensor
# parallel, dtypes, utilisation, for the profile before and after), so each list is indexed
# once and its index remembered: at most 1,024 of them, each for an argument list of at most
# 64 arguments and 4 KiB, so the memory held stays bounded whatever requests arrive (a longer
# list is indexed every time).
_REMEMBERED_ARGS = 64
_REMEMBERED_CHARS = 4096
_REMEMBERED_LISTS = 1024

_remembered: OrderedDict[tuple[tuple[str, ...], bool], FlagIndex] = OrderedDict()
_last: tuple[tuple[str, ...], bool, FlagIndex] = ((), False, {})
"""The tuple asked last (held, so its identity cannot be reused; a tuple, so it cannot have
changed) and its index: the lookups of one sizing mostly ask the same arguments in a row."""


def _index_of(args: Sequence[str], folded: bool) -> FlagIndex:
    """The index of `args`, remembered for short lists."""
    global _last
    last_args, last_folded, last_index = _last
    if args is last_args and folded is last_folded:
        return last_index
    key = args if isinstance(args, tuple) else tuple(args)
    index = _remembered.get((key, folded))
    if index is None:
        index = _index(key, folded)
        if len(key) > _REMEMBERED_ARGS or sum(map(len, key)) > _REMEMBERED_CHARS:
            return index
        _remembered[(key, folded)] = index
        if len(_remembered) > _REMEMBERED_LISTS:
            _remembered.popitem(last=False)
    _last = (key, folded, index)
    return index


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
