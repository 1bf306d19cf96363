"""The stand-in engine's argument checks, as a real engine would make them."""

from __future__ import annotations

import pytest

from fleet_svc.standin.options import OptionsError, parse_options
from fleet_svc.standin.server import completion_text


@pytest.mark.parametrize(
    ("args", "visible", "tp"),
    [
        (["--tensor-parallel-size", "2"], "0,1", 2),
        (["-tp", "1"], "3", 1),
        (["--tp-size=4"], "0,1,2,3", 4),
        (["--tp", "2"], "4,5", 2),
        (["--tp_size", "1"], "0", 1),
        ([], "0,1", None),  # no TP flag: nothing to match
    ],
)
def test_tensor_parallel_matching_the_cards_is_accepted(
    args: list[str], visible: str, tp: int | None
) -> None:
    """Each engine's TP spelling is read and accepted when it equals the visible cards."""
    opts = parse_options(["--port", "1", *args], {"CUDA_VISIBLE_DEVICES": visible})
    assert opts.tensor_parallel == tp
    assert len(opts.gpus) == len(visible.split(","))


@pytest.mark.parametrize(
    ("args", "visible"),
    [
        (["--tensor-parallel-size", "2"], "0"),
        (["-tp", "1"], ""),
        (["--tp-size", "8"], "0,1"),
        (["--tp_size", "0"], ""),
        (["--tp", "two"], "0"),
    ],
)
def test_tensor_parallel_unlike_the_cards_is_refused(args: list[str], visible: str) -> None:
    """A TP size other than the visible cards' count (or not a number) is refused."""
    with pytest.raises(OptionsError):
        parse_options(["--port", "1", *args], {"CUDA_VISIBLE_DEVICES": visible})


@pytest.mark.parametrize(
    ("flag", "value", "ok"),
    [
        ("--max-model-len", "8192", True),
        ("--context-length", "1", True),
        ("--ctx-size", "0", False),
        ("-c", "-4", False),
        ("--max_seq_len", "8k", False),
    ],
)
def test_context_must_be_a_positive_whole_number(flag: str, value: str, ok: bool) -> None:
    """Context flags take positive whole numbers only."""
    argv = ["--port", "1", flag, value]
    if ok:
        assert parse_options(argv, {}).context_tokens == int(value)
    else:
        with pytest.raises(OptionsError, match="positive integer"):
            parse_options(argv, {})


def test_other_engine_flags_are_accepted_and_ignored() -> None:
    """Flags the stand-in does not know are let through, as engine profiles carry many."""
    opts = parse_options(
        ["--port", "5", "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "-ngl", "99"],
        {},
    )
    assert opts.port == 5 and not opts.fail_on_start


@pytest.mark.parametrize(
    ("value", "fails"), [("1", True), ("yes", True), ("0", False), ("", False)]
)
def test_fail_env_makes_it_fail_on_start(value: str, fails: bool) -> None:
    """LLMGW_STANDIN_FAIL set (and not 0) fails the start, arguments unchanged."""
    assert parse_options(["--port", "1"], {"LLMGW_STANDIN_FAIL": value}).fail_on_start is fails


def test_completion_is_deterministic_in_the_prompt() -> None:
    """The same prompt gets the same words, as many as asked (capped at 256)."""
    assert completion_text("hi", 5) == completion_text("hi", 5)
    assert len(completion_text("hi", 5).split()) == 5
    assert len(completion_text("hi", 10_000).split()) == 256


def test_context_past_the_kv_capacity_is_refused_as_vllm_refuses_it() -> None:
    """A context longer than --kv-capacity-tokens is refused with vLLM's error line."""
    with pytest.raises(OptionsError, match="larger than the maximum number of tokens"):
        parse_options(
            ["--port", "1", "--max-model-len", "16384", "--kv-capacity-tokens", "12000"], {}
        )
    opts = parse_options(
        ["--port", "1", "--max-model-len", "12000", "--kv-capacity-tokens", "12000"], {}
    )
    assert opts.context_tokens == 12000


@pytest.mark.parametrize(
    ("engine", "args", "tp", "context"),
    [
        ("vllm", ["--tensor_parallel_size=2", "--max_model_len", "8192"], 2, 8192),
        ("vllm", ["-tp", "2", "--max-model-len=4096"], 2, 4096),
        ("sglang", ["--tp-size", "2", "--context-length", "32768"], 2, 32768),
        ("sglang", ["--tensor-parallel-size=2"], 2, None),
    ],
)
def test_standing_in_for_an_engine_reads_its_flags_with_its_grammar(
    engine: str, args: list[str], tp: int, context: int | None
) -> None:
    """As a registered engine the stand-in reads that engine's spellings of the tensor-parallel
    and context flags, as the planner writes them."""
    opts = parse_options(
        ["--port", "1", "--engine", engine, *args], {"CUDA_VISIBLE_DEVICES": "0,1"}
    )
    assert (opts.tensor_parallel, opts.context_tokens) == (tp, context)


def test_standing_in_for_vllm_refuses_what_vllm_refuses() -> None:
    """As vLLM, a tensor-parallel size other than the visible cards, in any spelling, stops it."""
    with pytest.raises(OptionsError, match="tensor parallel size 4"):
        parse_options(
            ["--port", "1", "--engine", "vllm", "--tensor_parallel_size=4"],
            {"CUDA_VISIBLE_DEVICES": "0,1"},
        )
    with pytest.raises(OptionsError, match="whole number"):
        parse_options(["--port", "1", "--engine", "vllm", "-tp", "two"], {})
