"""Engine argument editing: both flag forms, aliases, never a duplicate."""

from __future__ import annotations

import pytest

from llmgw.engines import args as args_module
from llmgw.engines.args import drop_arg, get_arg, get_int, set_arg

CTX = ("--ctx-size", "-c")
TS = ("--tensor-split", "-ts")
TP = ("--tensor-parallel-size", "-tp")


@pytest.mark.parametrize(
    ("args", "names", "value", "want"),
    [
        ([], CTX, "8192", ["--ctx-size", "8192"]),
        (["-c", "4096"], CTX, "8192", ["-c", "8192"]),
        (["--ctx-size=4096", "-ngl", "99"], CTX, "8192", ["--ctx-size=8192", "-ngl", "99"]),
        (["-c", "1", "--ctx-size", "2"], CTX, "3", ["-c", "3"]),
        (["-tp", "2", "--dtype", "auto"], TP, "4", ["-tp", "4", "--dtype", "auto"]),
        (["--tensor-parallel-size=2"], TP, "8", ["--tensor-parallel-size=8"]),
        (["--model", "m", "-c"], CTX, "512", ["--model", "m", "-c", "512"]),
    ],
)
def test_set_arg_replaces_where_it_stood(
    args: list[str], names: tuple[str, ...], value: str, want: list[str]
) -> None:
    """A flag that is set replaces its old value in place, in the form it was written, once."""
    assert set_arg(args, names, value) == want


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["-ts", "1,1", "-ngl", "99"], ["-ngl", "99"]),
        (["--tensor-split=3,1", "-c", "4"], ["-c", "4"]),
        (["-ts", "1,1", "--tensor-split", "2,2"], []),
        (["-c", "4"], ["-c", "4"]),
    ],
)
def test_drop_arg_removes_every_occurrence(args: list[str], want: list[str]) -> None:
    """Dropping a flag removes it under every alias, with its value."""
    assert drop_arg(args, TS) == want


def test_get_reads_the_last_occurrence_and_negative_values() -> None:
    """The last occurrence wins (as in the engines' parsers), and a negative number is a value."""
    args = ["-c", "1024", "--ctx-size=2048", "--seed", "-1"]
    assert get_int(args, CTX) == 2048
    assert get_arg(args, ("--seed",)) == "-1"
    assert get_int(["-c", "lots"], CTX, default=7) == 7
    assert get_arg([], CTX) is None


def test_remembered_lookups_answer_as_a_scan_and_stay_bounded() -> None:
    """Lookups are remembered for short argument lists only: the same answers as a scan, and
    a long (hostile) list is read every time, never kept."""
    short = ["--max-model-len", "8192", "--tensor_parallel_size=2"]
    assert args_module.get_arg(short, ("--tensor-parallel-size", "-tp"), folded=True) == "2"
    assert args_module.get_arg(short, ("--max-model-len",)) == "8192"
    long = ["--x", "1"] * 100 + ["--max-model-len", "4096"]
    before = len(args_module._remembered)
    assert args_module.get_arg(long, ("--max-model-len",)) == "4096"
    assert len(args_module._remembered) == before
    huge = ["--max-model-len", "1" * 10_000]
    assert args_module.get_arg(huge, ("--max-model-len",)) == "1" * 10_000
    assert len(args_module._remembered) == before
