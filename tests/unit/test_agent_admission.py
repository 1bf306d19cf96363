"""Which engine arguments and cards the agent refuses, and how desired sets reconcile."""

from __future__ import annotations

import pytest

from fleet_svc.agent.admission import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    REFUSAL_TABLES,
    ArgRules,
    RejectReason,
    check_gpus,
    refused_arg,
)
from fleet_svc.agent.reconcile import admit, plan_changes
from fleet_svc.agent.replica import ReplicaSpec


@pytest.mark.parametrize(
    "arg",
    [
        "x; rm -rf /",
        "a|b",
        "a&&b",
        "$HOME",
        "$(id)",
        "`id`",
        "a>b",
        "a<b",
        "one\ntwo",
        "cr\rlf",
        "nul\0",
    ],
)
@pytest.mark.parametrize("family", sorted(REFUSAL_TABLES))
def test_shell_syntax_is_refused_for_every_engine(arg: str, family: str) -> None:
    """An argument carrying shell syntax is refused whatever the engine."""
    why = refused_arg(["--served-model-name", arg], ArgRules(family))
    assert why is not None and "shell syntax" in why


@pytest.mark.parametrize(
    ("family", "args", "names"),
    [
        ("vllm", ["--worker-cls", "evil.W"], "--worker-cls"),
        ("vllm", ["--worker-extension-cls=evil.W"], "--worker-extension-cls"),
        ("vllm", ["--worker_cls", "evil.W"], "--worker-cls"),  # vLLM reads _ as -
        ("vllm", ["--worker-ext", "evil.W"], "--worker-extension-cls"),  # argparse abbreviation
        ("vllm", ["--trust-remote-code"], "--trust-remote-code"),
        ("vllm", ["--middleware", "evil.mw"], "--middleware"),
        ("vllm", ["--tool-parser-plugin", "/tmp/p.py"], "--tool-parser-plugin"),
        ("vllm", ["--config", "/tmp/more.yaml"], "--config"),
        ("vllm", ["--chat-template", "/etc/shadow"], "--chat-template"),
        ("vllm", ["--allowed-local-media-path", "/"], "--allowed-local-media-path"),
        ("vllm", ["--port", "80"], "--port"),
        ("sglang", ["--enable-custom-logit-processor"], "--enable-custom-logit-processor"),
        ("sglang", ["--trust-remote-code"], "--trust-remote-code"),
        ("trtllm", ["--extra_llm_api_options", "x.yaml"], "--extra_llm_api_options"),
        ("trtllm", ["--trust_remote_code"], "--trust_remote_code"),
        ("llamacpp", ["--rpc", "10.0.0.1:50052"], "--rpc"),
        ("llamacpp", ["--path", "/"], "--path"),
        ("llamacpp", ["--slot-save-path", "/etc"], "--slot-save-path"),
        ("llamacpp", ["-m", "/other.gguf"], "-m"),
        ("llamacpp", ["--host", "0.0.0.0"], "--host"),
        ("standin", ["--port=1"], "--port"),
    ],
)
def test_engine_flags_that_run_other_code_or_files_are_refused(
    family: str, args: list[str], names: str
) -> None:
    """Each flag of the refusal table is refused in either spelling, saying which and why."""
    why = refused_arg(["--max-model-len", "4096", *args], ArgRules(family))
    assert why is not None and names in why and "refused:" in why


@pytest.mark.parametrize(
    ("family", "args"),
    [
        ("vllm", ["--max-model-len", "8192", "--tensor-parallel-size", "2", "-tp", "2"]),
        ("vllm", ["--gpu-memory-utilization=0.9", "--enable-prefix-caching"]),
        ("vllm", ["--chat-template", "{{ messages[0].content }}"]),  # inline, not a path
        ("vllm", ["--max-num-seqs", "64", "--load-format", "safetensors"]),
        ("sglang", ["--context-length", "8192", "--tp", "2", "--mem-fraction-static", "0.85"]),
        ("trtllm", ["--max_seq_len", "8192", "--tp_size", "2"]),
        ("llamacpp", ["--ctx-size", "8192", "-np", "4", "--split-mode", "layer", "-ngl", "-1"]),
        ("llamacpp", ["--chat-template", "chatml"]),
        ("llamacpp", ["--pa"]),  # llama.cpp does not abbreviate: not --path
        ("standin", ["--load-s", "0.2", "--fail-on-start"]),
        ("vllm", []),
    ],
)
def test_ordinary_profile_args_pass(family: str, args: list[str]) -> None:
    """The arguments profiles really carry are accepted."""
    assert refused_arg(args, ArgRules(family)) is None


def test_operator_can_allow_and_add_refusals() -> None:
    """allow_flags lifts a refusal on this node; refuse_flags adds one with its reason."""
    rules = ArgRules("vllm", allow=frozenset({"--trust-remote-code"}), refuse={"--seed": "no"})
    assert refused_arg(["--trust-remote-code"], rules) is None
    why = refused_arg(["--seed=1"], rules)
    assert why is not None and "no" in why


@pytest.mark.parametrize(
    ("args", "text"),
    [(["-x"] * (MAX_ARGS + 1), "arguments"), (["a" * (MAX_ARG_CHARS + 1)], "characters")],
)
def test_payload_sized_args_are_refused(args: list[str], text: str) -> None:
    """Too many or too long arguments are refused before anything else."""
    why = refused_arg(args, ArgRules("standin"))
    assert why is not None and text in why


@pytest.mark.parametrize(
    ("gpus", "taken", "reason"),
    [
        ((0, 1), {}, None),
        ((), {}, None),
        ((4,), {}, RejectReason.GPUS_UNKNOWN),
        ((-1,), {}, RejectReason.GPUS_UNKNOWN),
        ((1, 1), {}, RejectReason.GPUS_UNKNOWN),
        ((1, 2), {2: "other"}, RejectReason.GPUS_BUSY),
    ],
)
def test_cards_must_be_the_nodes_and_free(
    gpus: tuple[int, ...], taken: dict[int, str], reason: RejectReason | None
) -> None:
    """A replica's cards must exist on the node, be distinct and not given to another."""
    found = check_gpus(gpus, range(4), taken)
    assert (found[0] if found else None) is reason


ENGINES = {"standin": ArgRules("standin"), "vllm": ArgRules("vllm")}


def rs(replica_id: str, revision: int = 1, engine: str = "standin", *gpus: int) -> ReplicaSpec:
    """A replica spec."""
    return ReplicaSpec(replica_id, revision, engine, model="m", gpus=gpus)


def test_admit_refuses_unknown_engines_busy_cards_and_repeated_ids() -> None:
    """Admission keeps the first claimant of a card and of an id, refusing the rest."""
    accepted, rejected = admit(
        [rs("a", 1, "standin", 0), rs("b", 1, "tgi", 1), rs("c", 1, "vllm", 0), rs("a", 2)],
        ENGINES,
        [0, 1],
    )
    assert [s.replica_id for s in accepted] == ["a"]
    assert [(r.replica_id, r.reason) for r in rejected] == [
        ("b", RejectReason.ENGINE_NOT_ALLOWED),
        ("c", RejectReason.GPUS_BUSY),
        ("a", RejectReason.DUPLICATE_REPLICA),
    ]
    assert "standin, vllm" in rejected[0].message


def test_plan_keeps_same_revision_replaces_new_and_stops_missing() -> None:
    """Same (id, revision) is kept, a new revision stops then starts, an absent one stops."""
    running = {"keep": rs("keep"), "bump": rs("bump", 1), "gone": rs("gone")}
    changes = plan_changes([rs("keep"), rs("bump", 2), rs("new")], running, ENGINES, [0, 1])
    assert changes.keep == (rs("keep"),)
    assert changes.stop == ("bump", "gone")
    assert changes.start == (rs("bump", 2), rs("new"))
    assert changes.rejected == ()


def test_plan_is_idempotent() -> None:
    """Applying a set to what already runs it changes nothing."""
    desired = [rs("a", 1, "standin", 0), rs("b", 3, "vllm", 1)]
    changes = plan_changes(desired, {s.replica_id: s for s in desired}, ENGINES, [0, 1])
    assert (changes.stop, changes.start, len(changes.keep)) == ((), (), 2)


def test_refused_new_revision_stops_the_old_one() -> None:
    """A running replica whose new revision is refused is stopped, not left passing for it."""
    changes = plan_changes([rs("a", 2, "tgi")], {"a": rs("a", 1)}, ENGINES, [0])
    assert changes.stop == ("a",) and changes.start == ()
    assert changes.rejected[0].reason is RejectReason.ENGINE_NOT_ALLOWED
