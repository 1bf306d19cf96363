"""Which engine arguments and cards the agent refuses, and how desired sets reconcile."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_svc.agent.admission import (
    ALLOW_TABLES,
    MAX_ARG_CHARS,
    MAX_ARGS,
    REFUSAL_TABLES,
    ArgRules,
    RejectReason,
    SourceRules,
    check_gpus,
    check_source,
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


CONTEXT = {
    "vllm": ["--max-model-len", "4096"],
    "sglang": ["--context-length", "4096"],
    "trtllm": ["--max_seq_len", "4096"],
    "llamacpp": ["--ctx-size", "4096"],
    "standin": ["--max-model-len", "4096"],
}
"""An allowed context flag of each family."""


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
    """Each flag of the refusal table is refused in either spelling, saying which and why
    (after an allowed flag of the engine's, so the refusal is the flag's own)."""
    why = refused_arg([*CONTEXT[family], *args], ArgRules(family))
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
        ("b", RejectReason.ENGINE_NOT_ALLOWED.value),
        ("c", RejectReason.GPUS_BUSY.value),
        ("a", RejectReason.DUPLICATE_REPLICA.value),
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
    assert changes.rejected[0].reason == RejectReason.ENGINE_NOT_ALLOWED.value


# -- the allow-lists -------------------------------------------------------------------------

CODE_LOADING = [
    ("vllm", ["--trust-remote-code"]),
    ("vllm", ["--worker-cls", "evilpkg.Worker"]),
    ("vllm", ["--worker-cls=evilpkg.Worker"]),
    ("vllm", ["--scheduler-cls", "evilpkg.Scheduler"]),
    ("vllm", ["--kv-transfer-config", '{"kv_connector_module_path": "evilpkg"}']),
    ("vllm", ["--speculative-config", '{"model": "evil/drafter"}']),
    ("vllm", ["--logits-processors", "evilpkg:Proc"]),
    ("vllm", ["--tool-parser-plugin", "/tmp/p.py"]),
    ("vllm", ["--reasoning-parser-plugin", "/tmp/p.py"]),
    ("vllm", ["--middleware", "evilpkg.mw"]),
    ("vllm", ["--enable-lora"]),
    ("vllm", ["--lora-modules", "x=evil/lora"]),
    ("vllm", ["--tokenizer", "evil/tok"]),
    ("vllm", ["--hf-overrides", '{"architectures": ["X"]}']),
    ("vllm", ["--model-loader-extra-config", "{}"]),
    ("vllm", ["--compilation-config", "{}"]),
    ("vllm", ["--distributed-executor-backend", "evilpkg.Executor"]),
    ("sglang", ["--trust-remote-code"]),
    ("sglang", ["--enable-custom-logit-processor"]),
    ("sglang", ["--speculative-algorithm", "EAGLE"]),
    ("sglang", ["--speculative-draft-model-path", "evil/drafter"]),
    ("sglang", ["--lora-paths", "evil/lora"]),
    ("trtllm", ["--trust_remote_code"]),
    ("trtllm", ["--extra_llm_api_options", "x.yaml"]),
    ("trtllm", ["--tokenizer", "evil/tok"]),
    ("llamacpp", ["--model-draft", "/tmp/d.gguf"]),
    ("llamacpp", ["-md", "/tmp/d.gguf"]),
    ("llamacpp", ["--lora", "/tmp/l.gguf"]),
    ("llamacpp", ["--mmproj", "/tmp/p.gguf"]),
    ("llamacpp", ["--chat-template-file", "/etc/shadow"]),
    ("llamacpp", ["--rpc", "10.0.0.1:50052"]),
]


@pytest.mark.parametrize(("family", "args"), CODE_LOADING)
def test_flags_that_load_code_or_models_pass_only_where_the_config_allows(
    family: str, args: list[str]
) -> None:
    """Refused by default, naming the flag and the way to allow it; allowed by allow_flags."""
    flag = args[0].split("=", 1)[0]
    why = refused_arg(args, ArgRules(family))
    assert why is not None and flag in why and "refused" in why and "allow" in why
    assert refused_arg(args, ArgRules(family, allow=frozenset({flag}))) is None


@pytest.mark.parametrize("family", ["vllm", "sglang", "trtllm", "llamacpp", "standin"])
def test_the_address_flags_are_never_passed_even_when_allowed(family: str) -> None:
    rules = ArgRules(family, allow=frozenset({"--host", "--port"}))
    for args in (["--port", "80"], ["--host=0.0.0.0"]):
        why = refused_arg(args, rules)
        assert why is not None and "address" in why


@pytest.mark.parametrize(
    ("family", "args", "named"),
    [
        ("vllm", ["--served-model-name", "other"], "--served-model-name"),
        ("vllm", ["--max-model", "8192"], "--max-model"),  # argparse would expand it
        ("vllm", ["--api-key", "x"], "--api-key"),
        ("vllm", ["-O3"], "-O3"),
        ("llamacpp", ["--pa"], "--pa"),  # not --path (llama.cpp does not abbreviate)
        ("llamacpp", ["--alias", "other"], "--alias"),
        ("sglang", ["--model-path", "evil/model"], "--model-path"),
        ("trtllm", ["--host_cache_size", "1"], "--host_cache_size"),
        ("standin", ["--model", "other"], "--model"),
    ],
)
def test_a_flag_on_no_list_is_refused_with_its_name(
    family: str, args: list[str], named: str
) -> None:
    why = refused_arg(args, ArgRules(family))
    assert why is not None and named in why and "allow-list" in why
    assert refused_arg(args, ArgRules(family, allow=frozenset({named}))) is None


@pytest.mark.parametrize(
    ("family", "args"),
    [
        ("vllm", ["evil/model"]),
        ("vllm", ["--enforce-eager", "evil/model"]),  # a switch takes no value
        ("vllm", ["--max-model-len", "8192", "8192"]),
        ("llamacpp", ["-"]),
    ],
)
def test_a_word_that_is_no_flags_value_is_refused(family: str, args: list[str]) -> None:
    """Positional arguments could be read as a second model: only the agent places one."""
    why = refused_arg(args, ArgRules(family))
    assert why is not None and "not the value of a flag" in why


@pytest.mark.parametrize("family", ["vllm", "sglang", "trtllm", "llamacpp", "standin"])
def test_every_allowed_flag_passes_under_every_alias(family: str) -> None:
    """No allow-list entry collides with a refusal (each alias, with a value when it takes
    one)."""
    for flag in ALLOW_TABLES[family]:
        for name in flag.names:
            args = [name, "1"] if flag.value else [name]
            assert refused_arg(args, ArgRules(family)) is None, (family, name)


def test_the_stand_in_takes_its_own_knobs_whichever_engine_it_stands_in_for() -> None:
    from fleet_svc.agent.config import standin_engine

    args = ["--max-model-len", "8192", "--kv-capacity-tokens", "100", "--load-s", "0.3"]
    assert refused_arg(args, standin_engine("vllm").rules) is None
    assert refused_arg(args, ArgRules("vllm")) is not None  # the real vLLM is not given them
    assert refused_arg(["--trust-remote-code"], standin_engine("vllm").rules) is not None


@pytest.mark.parametrize(
    ("family", "args"),
    [
        # llmgw up's example catalog (llmgw/demo/catalog.py)
        ("llamacpp", ["--ctx-size", "4096", "--parallel", "1"]),
        ("vllm", ["--max-model-len", "8192", "--tensor-parallel-size", "1"]),
        # what the planner writes (llmgw/engines: context, cards, caches, splits)
        ("llamacpp", ["-c", "8192", "-np", "1", "-ngl", "99", "-ctk", "q8_0", "-ctv", "q8_0"]),
        ("llamacpp", ["-fa", "on", "--split-mode", "layer", "-ts", "1,1", "--kv-unified"]),
        ("vllm", ["--kv-cache-dtype", "fp8", "-pp", "2", "--no-enable-chunked-prefill"]),
        ("vllm", ["--max_model_len=8192", "--enforce-eager", "--block-size", "32"]),
        (
            "sglang",
            ["--context-length", "8192", "--page-size", "16", "--swa-full-tokens-ratio", "0.5"],
        ),
        ("trtllm", ["--max_seq_len", "8192", "--kv_cache_free_gpu_memory_fraction", "0.8"]),
    ],
)
def test_the_demo_profiles_and_planned_args_pass(family: str, args: list[str]) -> None:
    assert refused_arg(args, ArgRules(family)) is None


# -- sources ---------------------------------------------------------------------------------

HOSTILE = [
    "--trust-remote-code",
    "--worker-cls=evilpkg.Worker",
    "-m",
    "hf://org/name@main/../../../../tmp/x",
    "hf://org/name@main//x",
    "/models/../etc/passwd",
    "relative.gguf",
    "file:///etc/passwd",
    "hf://org/name\n--trust-remote-code",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_sources_are_refused_by_the_agent_too(source: str) -> None:
    rules = SourceRules(("/models",), lambda p: p)
    assert check_source(source, rules, needs_source=True) is not None
    assert check_source(source, rules, needs_source=False) is not None


def test_local_sources_must_really_be_under_a_root(tmp_path: Path) -> None:
    """A path under a root runs; outside, or a symlink under a root pointing out, does not;
    with no roots no local path runs; an engine not given the source is not asked."""
    import os

    root = tmp_path / "models"
    root.mkdir()
    (root / "m.gguf").write_bytes(b"x")
    outside = tmp_path / "secret.gguf"
    outside.write_bytes(b"x")
    (root / "link.gguf").symlink_to(outside)
    rules = SourceRules((os.path.realpath(root),), os.path.realpath)
    assert check_source(str(root / "m.gguf"), rules, needs_source=True) is None
    why = check_source(str(outside), rules, needs_source=True)
    assert why is not None and "outside" in why
    assert check_source(str(root / "link.gguf"), rules, needs_source=True) is not None
    assert check_source(str(root / "m.gguf"), SourceRules(), needs_source=True) is not None
    assert check_source(str(outside), SourceRules(), needs_source=False) is None
    assert check_source("", rules, needs_source=True) is not None
    assert check_source("", rules, needs_source=False) is None
    assert check_source("hf://org/name@v1.0", rules, needs_source=True) is None


def test_a_hostile_source_is_rejected_and_nothing_starts() -> None:
    engines = {"vllm": ArgRules("vllm", needs_source=True)}
    bad = ReplicaSpec("r1", 1, "vllm", model="m", source="--trust-remote-code")
    good = ReplicaSpec("r2", 1, "vllm", model="m", source="hf://org/name")
    changes = plan_changes([bad, good], {}, engines, range(2))
    assert [s.replica_id for s in changes.start] == ["r2"]
    assert [(r.replica_id, r.reason) for r in changes.rejected] == [
        ("r1", RejectReason.SOURCE_REFUSED.value)
    ]


PIN = "hf://org/model@0123456789abcdef0123456789abcdef01234567"


def test_a_pinned_source_an_engine_cannot_take_and_a_conflicting_arg_are_refused() -> None:
    """llama.cpp's -hf takes no revision: a pinned hf:// source is SOURCE_REFUSED naming the
    engine; vLLM with another --revision in its args is ARGS_REFUSED; the same pin passes."""
    engines = {
        "llamacpp": ArgRules("llamacpp", needs_source=True, pins_revision=False),
        "vllm": ArgRules("vllm", needs_source=True),
    }
    desired = [
        ReplicaSpec("a", 1, "llamacpp", source=PIN),
        ReplicaSpec("b", 1, "vllm", args=("--revision", "main"), source=PIN),
        ReplicaSpec("c", 1, "vllm", args=("--revision", PIN.rsplit("@", 1)[1]), source=PIN),
    ]
    accepted, rejected = admit(desired, engines, [0])
    assert [s.replica_id for s in accepted] == ["c"]
    by_id = {r.replica_id: r for r in rejected}
    assert (
        by_id["a"].reason == RejectReason.SOURCE_REFUSED.value and "llamacpp" in by_id["a"].message
    )
    assert by_id["b"].reason == RejectReason.ARGS_REFUSED.value and "main" in by_id["b"].message
