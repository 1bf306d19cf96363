"""The agent's config: parsing, defaults, and the commands it builds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_svc.agent.config import ConfigError, default_config, find_llama_server
from fleet_svc.agent.config_file import load_config, parse_config, parse_engine
from fleet_svc.agent.replica import ReplicaSpec

ROOT = Path(__file__).resolve().parents[2]


def no_path(name: str) -> str | None:
    """A PATH on which nothing is found."""
    return None


def test_example_config_parses_with_every_engine() -> None:
    """deploy/agent.example.yaml is a valid config naming the five engines."""
    config = load_config(ROOT / "deploy" / "agent.example.yaml")
    assert sorted(config.engines) == ["llamacpp", "sglang", "standin", "trtllm", "vllm"]
    assert config.engines["vllm"].rules.family == "vllm"
    assert config.engines["vllm"].start_timeout_s == 1800
    assert config.restart_limit.max_crashes == 5 and config.restart_backoff.cap_s == 60
    assert config.engines["standin"].program == (sys.executable, "-m", "fleet_svc.standin")


def test_command_fills_the_template_and_inserts_args_verbatim() -> None:
    """The command is the program and the filled template, profile args each one item and
    never expanded (a placeholder inside them stays literal)."""
    engine = parse_engine(
        "vllm",
        {
            "executable": "/opt/vllm/bin/vllm",
            "args": ["serve", "{source}", "--port={port}", "--host", "{host}", "{args}", "-x"],
        },
    )
    spec = ReplicaSpec(
        "r1", 3, "vllm", model="m", args=("--max-model-len", "{port} x"), source="/models/m"
    )
    assert engine.command(spec, "127.0.0.1", 8001) == [
        "/opt/vllm/bin/vllm",
        "serve",
        "/models/m",
        "--port=8001",
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "{port} x",
        "-x",
    ]


def test_args_placeholder_is_appended_when_the_template_omits_it() -> None:
    """A template without {args} gets the profile args at its end."""
    engine = parse_engine(
        "e", {"executable": "/bin/e", "family": "standin", "args": ["--p", "{port}"]}
    )
    assert engine.command(ReplicaSpec("r", 1, "e", args=("-a",)), "h", 1) == [
        "/bin/e",
        "--p",
        "1",
        "-a",
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "exactly one of executable"),
        ({"executable": "/bin/x", "module": "m"}, "exactly one of executable"),
        ({"executable": "llama-server-nowhere"}, "not on PATH"),
        ({"module": "os; rm"}, "dotted Python module"),
        ({"module": "m", "args": ["{bogus}"]}, "unknown placeholder"),
        ({"module": "m", "args": ["--x={args}"]}, "of its own"),
        ({"module": "m", "args": ["{args}", "{args}"]}, "once"),
        ({"module": "m", "args": "--port {port}"}, "list of strings"),
        ({"module": "m", "family": "tgi"}, "family"),
        ({"module": "m", "health_path": "health"}, "start with /"),
        ({"module": "m", "start_timeout_s": -1}, "start_timeout_s"),
        ({"module": "m", "command": "bash -c x"}, "engines.standin.command: unknown key"),
        ({"module": "m", "refuse_flags": ["--x"]}, "why"),
    ],
)
def test_malformed_engine_entries_are_refused(entry: dict[str, Any], message: str) -> None:
    """Each malformed engine entry is refused naming what is wrong."""
    with pytest.raises(ConfigError, match=message):
        parse_engine("standin", entry, which=no_path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "engines"),
        ([], "mapping"),
        ({"engines": {}}, "engines"),
        ({"engines": {"Bad Name": {"module": "m"}}}, "lower-case"),
        ({"engines": {"standin": {"module": "m"}}, "unhealthy_after": 0}, "unhealthy_after"),
        ({"engines": {"standin": {"module": "m"}}, "restart": {"factor": 0.5}}, "factor"),
        ({"engines": {"standin": {"module": "m"}}, "restart": {"max_crashes": 0}}, "max_crashes"),
    ],
)
def test_malformed_configs_are_refused(data: Any, message: str) -> None:
    """A config without engines or with nonsense supervision settings is refused."""
    with pytest.raises(ConfigError, match=message):
        parse_config(data, which=no_path)


def test_unreadable_config_file_is_refused(tmp_path: Path) -> None:
    """A file that is not YAML is refused naming the file."""
    path = tmp_path / "agent.yaml"
    path.write_text("engines: [unclosed")
    with pytest.raises(ConfigError, match=r"agent\.yaml"):
        load_config(path)


def test_default_config_runs_the_standin_and_llama_server_when_found() -> None:
    """Without a config the agent runs the stand-in, and llama.cpp only with a llama-server."""
    assert sorted(default_config().engines) == ["standin"]
    config = default_config(llama_server="/opt/llama/llama-server")
    assert sorted(config.engines) == ["llamacpp", "standin"]
    assert config.engines["llamacpp"].program == ("/opt/llama/llama-server",)
    assert config.engines["llamacpp"].rules.family == "llamacpp"


def test_demo_stands_in_for_the_engines_that_cannot_run_here() -> None:
    """--demo maps vllm, sglang, trtllm (and llamacpp without llama-server) to the stand-in,
    each keeping its own engine's argument refusals."""
    config = default_config(demo=True)
    assert sorted(config.engines) == ["llamacpp", "sglang", "standin", "trtllm", "vllm"]
    vllm = config.engines["vllm"]
    assert vllm.module == "fleet_svc.standin" and vllm.rules.family == "vllm"
    spec = ReplicaSpec("r", 1, "vllm", model="m")
    assert vllm.command(spec, "127.0.0.1", 9)[-2:] == ["--engine", "vllm"]
    real = default_config(demo=True, llama_server="/opt/llama-server")
    assert real.engines["llamacpp"].program == ("/opt/llama-server",)


def test_demo_keeps_a_config_files_engines() -> None:
    """--demo with a config adds stand-ins only for engines the file does not name."""
    base = parse_config(yaml.safe_load("engines: {vllm: {executable: /opt/vllm}}"))
    config = default_config(demo=True, base=base)
    assert config.engines["vllm"].program == ("/opt/vllm",)
    assert config.engines["sglang"].module == "fleet_svc.standin"


def test_llama_server_is_found_from_the_environment_then_path(tmp_path: Path) -> None:
    """$LLMGW_LLAMA_SERVER naming an executable wins over PATH; otherwise PATH's."""
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = {"LLMGW_LLAMA_SERVER": str(exe)}
    assert find_llama_server(env, which=no_path) == str(exe)
    assert find_llama_server({}, which=lambda n: "/usr/bin/" + n) == "/usr/bin/llama-server"
    assert find_llama_server({"LLMGW_LLAMA_SERVER": "/nope"}, which=no_path) is None


@pytest.mark.parametrize(
    ("source", "items"),
    [
        ("/models/tiny.gguf", ["-m", "/models/tiny.gguf"]),
        ("http://127.0.0.1:8000/tiny.gguf", ["-mu", "http://127.0.0.1:8000/tiny.gguf"]),
        ("hf://ggml-org/tiny-GGUF", ["-hf", "ggml-org/tiny-GGUF"]),
    ],
)
def test_llama_server_gets_the_source_in_the_form_it_takes(source: str, items: list[str]) -> None:
    """llama-server is given a file with -m, a URL with -mu and a Hugging Face repo with -hf."""
    engine = default_config(llama_server="/opt/llama-server").engines["llamacpp"]
    argv = engine.command(ReplicaSpec("r", 1, "llamacpp", model="tiny", source=source), "h", 5)
    assert argv == ["/opt/llama-server", "--host", "h", "--port", "5", *items, "--alias", "tiny"]


def test_example_vllm_takes_a_hub_repo_as_its_model_id() -> None:
    """A kind the engine maps nowhere is given bare: vLLM serves ORG/NAME for hf://ORG/NAME."""
    engine = load_config(ROOT / "deploy" / "agent.example.yaml").engines["vllm"]
    argv = engine.command(ReplicaSpec("r", 1, "vllm", source="hf://Qwen/Qwen3-8B"), "h", 5)
    assert argv[1:3] == ["serve", "Qwen/Qwen3-8B"]


@pytest.mark.parametrize(
    ("env_set", "on_path", "built", "want"),
    [
        (True, True, True, "told"),  # an operator's choice wins
        (False, True, True, "path"),  # then PATH
        (False, False, True, "built"),  # then `make llama-server`'s build cache
        (False, False, False, None),  # else no llama.cpp on this node
    ],
)
def test_llama_server_is_found_where_it_was_put(
    tmp_path: Path, env_set: bool, on_path: bool, built: bool, want: str | None
) -> None:
    """llama-server comes from $LLMGW_LLAMA_SERVER, else PATH, else the build cache."""
    paths = {}
    for name in ("told", "path", "built"):
        exe = tmp_path / name / "llama-server"
        exe.parent.mkdir()
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        paths[name] = str(exe)
    found = find_llama_server(
        env={"LLMGW_LLAMA_SERVER": paths["told"]} if env_set else {},
        which=lambda _name: paths["path"] if on_path else None,
        cache=Path(paths["built"]) if built else tmp_path / "absent" / "llama-server",
    )
    assert found == (paths[want] if want else None)


def test_source_roots_are_real_absolute_paths(tmp_path: Path) -> None:
    """`source_roots` are resolved (symlinks) at load; a relative one is refused; the agent's
    --source-root adds to them."""
    real = tmp_path / "models"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    config = parse_config(
        {"engines": {"standin": {"module": "fleet_svc.standin"}}, "source_roots": [str(link)]}
    )
    assert config.source_roots == (str(real.resolve()),)
    with pytest.raises(ConfigError, match="absolute"):
        parse_config({"engines": {"standin": {"module": "x"}}, "source_roots": ["models"]})
    assert default_config().source_roots == ()
    assert default_config(roots=[str(real)]).source_roots == (str(real.resolve()),)
    both = default_config(base=config, roots=["/opt/weights"])
    assert both.source_roots == (str(real.resolve()), "/opt/weights")


def test_which_engines_are_given_the_source() -> None:
    """llama-server and a template naming {source}/{source_args} are; the stand-in is not."""
    config = default_config(demo=True, llama_server="/opt/llama-server")
    assert config.engines["llamacpp"].rules.needs_source
    assert not config.engines["vllm"].rules.needs_source  # the stand-in for it
    example = load_config(ROOT / "deploy" / "agent.example.yaml")
    assert example.engines["vllm"].rules.needs_source
    assert example.engines["standin"].rules.extra  # the stand-in's own knobs


def test_allow_flags_lift_a_refusal_only_for_that_engine() -> None:
    from fleet_svc.agent.admission import refused_arg

    config = parse_config(
        {
            "engines": {
                "vllm": {"executable": "/opt/vllm", "allow_flags": ["--trust-remote-code"]},
                "other": {"executable": "/opt/vllm", "family": "vllm"},
            }
        }
    )
    assert refused_arg(["--trust-remote-code"], config.engines["vllm"].rules) is None
    assert refused_arg(["--trust-remote-code"], config.engines["other"].rules) is not None


def test_a_source_that_would_read_as_a_flag_never_reaches_the_command() -> None:
    """The last line before exec: even past admission, such a source is not passed."""
    llama = default_config(llama_server="/opt/llama-server").engines["llamacpp"]
    with pytest.raises(ValueError, match="flag"):
        llama.command(ReplicaSpec("r", 1, "llamacpp", source="--rpc"), "127.0.0.1", 9)
    argv = llama.command(ReplicaSpec("r", 1, "llamacpp", source="/m/x.gguf"), "127.0.0.1", 9)
    assert argv[argv.index("-m") + 1] == "/m/x.gguf"


COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("engine", "source_item"),
    [("vllm", ["serve", "Qwen/Qwen3-8B", "--revision", COMMIT]), ("trtllm", None)],
)
def test_example_engines_are_given_the_pinned_revision(
    engine: str, source_item: list[str] | None
) -> None:
    """The example vLLM command is `serve ORG/NAME --revision COMMIT`; trtllm-serve gets the
    repo id then `--revision COMMIT`, and its served name is that repo id."""
    cfg = load_config(ROOT / "deploy" / "agent.example.yaml").engines[engine]
    spec = ReplicaSpec("r", 1, engine, model="qwen", source=f"hf://Qwen/Qwen3-8B@{COMMIT}")
    argv = cfg.command(spec, "h", 5)
    if source_item is not None:
        assert argv[1:5] == source_item
    else:
        assert argv[1:4] == ["Qwen/Qwen3-8B", "--revision", COMMIT]
        assert cfg.served_name(spec) == "Qwen/Qwen3-8B"
    assert cfg.rules.pins_revision


def test_a_revision_item_in_source_args_places_the_pin_and_goes_without_one() -> None:
    """`{revision}` in an hf source_args item is the pin; with no pin the item is left out."""
    cfg = parse_engine(
        "custom",
        {
            "executable": "/bin/true",
            "family": "llamacpp",
            "args": ["{source_args}"],
            "source_args": {"hf": ["--repo", "{value}", "--rev={revision}"]},
        },
        which=no_path,
    )
    assert cfg.rules.pins_revision
    pinned = ReplicaSpec("r", 1, "custom", source=f"hf://o/n@{COMMIT}")
    assert cfg.command(pinned, "h", 5) == ["/bin/true", "--repo", "o/n", f"--rev={COMMIT}"]
    bare = ReplicaSpec("r", 1, "custom", source="hf://o/n")
    assert cfg.command(bare, "h", 5) == ["/bin/true", "--repo", "o/n"]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"models_path": "v1/models"}, "models_path must start with /"),
        ({"fetch_urls": "yes"}, "fetch_urls must be true or false"),
    ],
)
def test_bad_readiness_and_fetch_keys_are_refused(entry: dict[str, Any], says: str) -> None:
    """models_path is a path (or "" for none); fetch_urls a boolean."""
    with pytest.raises(ConfigError, match=says):
        parse_engine("vllm", {"executable": "/bin/true", **entry}, which=no_path)


def test_llamacpp_fetches_urls_and_others_do_not_by_default() -> None:
    """The llama.cpp family fetches URL sources itself; vLLM is given the URL as it is."""
    example = load_config(ROOT / "deploy" / "agent.example.yaml").engines
    assert example["llamacpp"].fetches("https://h/x.gguf")
    assert not example["llamacpp"].fetches("/srv/models/x.gguf")
    assert not example["vllm"].fetches("https://h/x.gguf")
    built = default_config(llama_server="/opt/llama-server").engines["llamacpp"]
    assert built.fetches("https://h/x.gguf") and not built.rules.pins_revision


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("restrat: always", "agent.yaml: restrat: unknown key; did you mean restart?"),
        ("restart: {cap: 5}", "agent.yaml: restart.cap: unknown key; did you mean cap_s?"),
        ("restart: {max_crashes: five}", "restart.max_crashes: want a whole number >= 1, not str"),
        ("restart: {base_s: soon}", "restart: base_s: want a number >= 0, not str 'soon'"),
        ("restart: 5", "restart: want a mapping, not int 5"),
        ("engine_host: 5", "engine_host: want a string, not int 5"),
        ("unhealthy_after: true", "unhealthy_after: want a whole number >= 1, not bool"),
        ("health_interval: 2", "health_interval: unknown key; did you mean health_interval_s?"),
    ],
)
def test_config_mistakes_are_refused_with_the_key_and_a_suggestion(
    text: str, message: str, tmp_path: Path
) -> None:
    """A typo'd or mistyped key of the agent config is refused, the message naming the key's
    path and the nearest valid key; nothing passes silently as a default."""
    path = tmp_path / "agent.yaml"
    path.write_text(f"engines:\n  standin: {{module: fleet_svc.standin}}\n{text}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value).replace(str(tmp_path) + "/", "")


def test_engine_key_typo_is_refused_with_a_suggestion() -> None:
    """An engine's key is checked the same way, its path under engines."""
    with pytest.raises(
        ConfigError, match=r"engines\.standin\.modul: unknown key; did you mean module\?"
    ):
        parse_engine("standin", {"modul": "fleet_svc.standin"}, which=no_path)
