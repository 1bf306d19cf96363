"""The stand-in's command line: its own flags, and the engine flags it checks as engines do."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet_svc.standin.gang import GangError, GangRole, read_role
from llmgw.cmdline import add_version
from llmgw.engines import registry
from llmgw.engines.errors import EngineRefuses

GIB = 1 << 30

# Standing in for an engine the registry knows (`--engine vllm`), the stand-in reads that
# engine's tensor-parallel and context flags through the engine's own grammar
# (llmgw.engines), the one the planner writes them with. Under any other name it takes every
# engine's spelling, below: tensor-parallel flags (vLLM, SGLang, TensorRT-LLM), whose size must
# match the cards given, as a real engine refuses to start otherwise; context flags (vLLM,
# SGLang, llama.cpp, TensorRT-LLM), positive whole numbers.
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp", "--tp_size")
CONTEXT_FLAGS = ("--max-model-len", "--context-length", "--ctx-size", "-c", "--max_seq_len")
# Environment switch that makes the stand-in fail on start whatever its arguments, so a test
# can break one engine without changing the arguments the fleet sends.
FAIL_ENV = "LLMGW_STANDIN_FAIL"
# Environment naming a folder where the stand-in writes the command line it was started with
# (<folder>/<$LLMGW_REPLICA_ID or its pid>.json, a JSON list): the argv a test checks is the one
# the agent's child really got.
ARGV_DIR_ENV = "LLMGW_STANDIN_ARGV_DIR"
# The flags a real engine is told its served name with: vLLM's and SGLang's
# --served-model-name, llama-server's --alias; the stand-in's own --model.
NAME_FLAGS = ("--model", "--served-model-name", "--alias")


class OptionsError(ValueError):
    """Arguments a real engine would refuse; the message is the engine-like error line."""


@dataclass(frozen=True)
class Options:
    """What the stand-in was asked to do."""

    port: int
    host: str = "127.0.0.1"
    model: str = "standin"
    engine: str = "standin"
    load_s: float = 0.5
    fail_on_start: bool = False
    fail_after_s: float | None = None
    memory_bytes: int = GIB
    tensor_parallel: int | None = None
    context_tokens: int | None = None
    gpus: tuple[int, ...] = ()
    gang: GangRole | None = None
    """Its part in a gang spanning several nodes (None: it runs alone)."""
    serve_no_model: bool = False
    """Answer /health but list no model, as llama-server in router mode does."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fleet_svc.standin",
        description="An OpenAI-shaped stand-in engine: /health (503 while loading), "
        "/v1/models, /v1/completions, /v1/chat/completions. Other engine flags are accepted "
        "and ignored; tensor-parallel and context flags are checked as the engines do.",
        # Real engines' parsers differ on abbreviations; the stand-in reads only whole flags.
        allow_abbrev=False,
    )
    # --version as every entry point's (its exit codes stay an engine's: argparse's 2).
    add_version(parser)
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        *NAME_FLAGS, dest="model", default=None, help="the model name it serves (its aliases)"
    )
    parser.add_argument(
        "--serve-no-model",
        action="store_true",
        help="answer /health but list no model (llama-server's router mode)",
    )
    parser.add_argument("--engine", default="standin", help="the engine it stands in for")
    parser.add_argument("--load-s", type=float, default=0.5, help="seconds it 'loads' for")
    parser.add_argument("--fail-on-start", action="store_true", help="exit non-zero after loading")
    parser.add_argument(
        "--fail-after-s", type=float, default=None, help="crash this long after becoming ready"
    )
    parser.add_argument(
        "--memory-bytes", type=int, default=GIB, help="memory it claims on each of its cards"
    )
    parser.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="tokens its KV cache 'holds': a longer context is refused as vLLM refuses it",
    )
    for flag in TP_FLAGS:
        parser.add_argument(flag, dest=f"tp{TP_FLAGS.index(flag)}", default=None)
    for flag in CONTEXT_FLAGS:
        parser.add_argument(flag, dest=f"ctx{CONTEXT_FLAGS.index(flag)}", default=None)
    return parser


def _positive(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise OptionsError(f"argument {flag}: invalid value {value!r}: must be a positive integer")
    return number


def _as_engine_reads(name: str, argv: Sequence[str]) -> tuple[int | None, int | None] | None:
    """(tensor parallel, context) as the registered engine `name` reads them from `argv`
    (None for either flag absent); None when no registered engine has such flags.

    Raises:
        OptionsError: a value the engine refuses.
    """
    engine = registry.find(name)
    tp_flag = getattr(engine, "tp_flag", ())
    context_flag = getattr(engine, "context_flag", ())
    if engine is None or not (tp_flag and context_flag):
        return None
    try:
        return (
            engine.grammar.count(argv, tp_flag),
            engine.grammar.count(argv, context_flag),
        )
    except EngineRefuses as exc:
        raise OptionsError(f"error: {exc.message}") from exc


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """The stand-in's options from its arguments and environment.

    Raises:
        OptionsError: an engine flag a real engine would refuse (a context that is not a
            positive whole number, a tensor-parallel size other than the visible cards).
        SystemExit: argparse's own errors (a missing --port), as any CLI.
    """
    parser = _parser()
    ns, rest = parser.parse_known_args(list(argv))
    if ns.model is None:
        # No name flag: served under the model it was given, as vLLM (`serve MODEL`) and
        # trtllm-serve (`MODEL`) serve a model they are given no other name for.
        given = [a for a in rest[:2] if not a.startswith("-") and a != "serve"]
        ns.model = given[0] if given else "standin"
    read = _as_engine_reads(ns.engine, argv)
    if read is not None:
        tp, context = read
    else:
        tp = context = None
        for i, flag in enumerate(TP_FLAGS):
            if getattr(ns, f"tp{i}") is not None:
                tp = _positive(flag, getattr(ns, f"tp{i}"))
        for i, flag in enumerate(CONTEXT_FLAGS):
            if getattr(ns, f"ctx{i}") is not None:
                context = _positive(flag, getattr(ns, f"ctx{i}"))
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    try:
        gpus = tuple(int(g) for g in visible.split(",") if g.strip())
    except ValueError as exc:
        raise OptionsError(f"CUDA_VISIBLE_DEVICES={visible!r} is not a list of indices") from exc
    try:
        gang = read_role(ns.engine, argv, len(gpus), env)
    except GangError as exc:
        raise OptionsError(str(exc)) from exc
    if tp is not None and tp != len(gpus) and (gang is None or gang.rpc):
        # vLLM stops with a ValueError of this sense when the world size does not match the
        # GPUs it can use.
        raise OptionsError(
            f"ValueError: tensor parallel size {tp} does not match the {len(gpus)} GPUs "
            f"available (CUDA_VISIBLE_DEVICES={visible!r})"
        )
    if (
        ns.kv_capacity_tokens is not None
        and context is not None
        and context > ns.kv_capacity_tokens
    ):
        # vLLM's refusal when the context does not fit the KV cache it could allocate
        # (the ground truth's gt-024 row quotes it).
        raise OptionsError(
            f"ValueError: The model's max seq len ({context}) is larger than the maximum number "
            f"of tokens that can be stored in KV cache ({ns.kv_capacity_tokens})."
        )
    if ns.memory_bytes < 0:
        raise OptionsError("argument --memory-bytes: must not be negative")
    return Options(
        port=ns.port,
        host=ns.host,
        model=ns.model,
        engine=ns.engine,
        load_s=max(0.0, ns.load_s),
        fail_on_start=ns.fail_on_start or env.get(FAIL_ENV, "") not in ("", "0"),
        fail_after_s=ns.fail_after_s,
        memory_bytes=ns.memory_bytes,
        tensor_parallel=tp,
        context_tokens=context,
        gpus=gpus,
        gang=gang,
        serve_no_model=ns.serve_no_model,
    )
