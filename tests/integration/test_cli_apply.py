"""`llmgw ctl apply -f` / `diff -f` and kubectl's `-o` formats, as operators run them: the
real command in a child process against a real fleet with a scripted agent."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_cli_ctl import PATIENT, _env, ctl, write_model
from tests.support.fleet import running_fleet


def _tweak(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    data["profiles"][0]["args"] += ["--max-num-seqs", "32"]
    path.write_text(yaml.safe_dump(data))


async def test_apply_creates_then_is_unchanged_then_diffs_and_prunes(tmp_path: Path) -> None:
    """A folder of two models: apply creates both; applied again, both are unchanged; after
    an edit, --dry-run and `diff` show the changed field and change nothing; apply then
    configures it with a rollout; dropping a file and pruning by name deletes that model."""
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "a.yaml", name="qwen-a")
    write_model(models / "b.yaml", name="qwen-b")
    (models / "notes.txt").write_text("not a model")
    async with running_fleet(tmp_path, liveness=PATIENT) as (fleet, _stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            first = await ctl(fleet.port, "apply", "-f", str(models))
            assert first.code == 0, first.err
            assert first.out.splitlines() == ["model/qwen-a created", "model/qwen-b created"]

            again = await ctl(fleet.port, "apply", "-f", str(models))
            assert again.code == 0, again.err
            assert again.out.splitlines() == ["model/qwen-a unchanged", "model/qwen-b unchanged"]
            same = await ctl(fleet.port, "diff", "-f", str(models))
            assert same.code == 0 and same.out == "", same.err

            _tweak(models / "b.yaml")
            dry = await ctl(fleet.port, "apply", "-f", str(models), "--dry-run")
            assert dry.code == 0, dry.err
            lines = dry.out.splitlines()
            assert lines[0] == "model/qwen-a unchanged (dry run)"
            assert lines[1] == "model/qwen-b configured (dry run)"
            assert '  + profiles[0].args[4]: "--max-num-seqs"' in lines
            assert '  + profiles[0].args[5]: "32"' in lines
            diff = await ctl(fleet.port, "diff", "-f", str(models), "-o", "json")
            assert diff.code == 1, diff.err  # as kubectl diff: 1 when something differs
            changed = diff.json()["models"]
            assert [m["name"] for m in changed] == ["qwen-b"]
            fields = {c["field"]: c["after"] for c in changed[0]["changes"]}
            assert fields["profiles[0].args[5]"] == "32"
            still = await ctl(fleet.port, "model", "show", "qwen-b", "-o", "json")
            assert still.json()["model"]["revision"] == "1", "a dry run wrote a revision"

            done = await ctl(fleet.port, "apply", "-f", str(models))
            assert done.code == 0, done.err
            assert done.out.splitlines()[0] == "model/qwen-a unchanged"
            assert done.out.splitlines()[1].startswith("model/qwen-b configured; rollout ro-")

            (models / "a.yaml").unlink()
            no_selector = await ctl(fleet.port, "apply", "-f", str(models), "--prune")
            assert no_selector.code == 64 and "--selector" in no_selector.err
            pruned = await ctl(
                fleet.port, "apply", "-f", str(models), "--prune", "--selector", "name=qwen-*"
            )
            assert pruned.code == 0, pruned.err
            assert pruned.out.splitlines() == ["model/qwen-b unchanged", "model/qwen-a pruned"]
            names = await ctl(fleet.port, "model", "list", "-o", "name")
            assert names.out.splitlines() == ["model/qwen-b"]
        finally:
            await agent.stop()


async def test_apply_with_canary_flags_rolls_a_changed_model_out_as_that_canary(
    tmp_path: Path,
) -> None:
    """`apply -f` with --canary-* flags rolls a changed model out as a canary with exactly the
    policy the flags give; the same flags on an unchanged model start nothing."""
    path = write_model(tmp_path / "m.yaml", name="qwen", replicas=1)
    async with running_fleet(tmp_path, liveness=PATIENT) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            created = await ctl(fleet.port, "apply", "-f", str(path))
            assert created.code == 0, created.err
            flags = ["--canary-steps", "20,100", "--canary-step-s", "600"]
            flags += ["--canary-min-requests", "7", "--canary-max-error-ratio", "0.05"]
            same = await ctl(fleet.port, "apply", "-f", str(path), *flags, "-o", "json")
            assert same.code == 0, same.err
            assert same.json()["models"][0]["rollout_id"] == ""
            _tweak(path)
            done = await ctl(fleet.port, "apply", "-f", str(path), *flags, "-o", "json")
            assert done.code == 0, done.err
            rid = done.json()["models"][0]["rollout_id"]
            assert rid.startswith("ro-"), done.out
            got = await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid), timeout=10)
            assert got.rollout.strategy == fleet_pb2.STRATEGY_CANARY
            policy = got.rollout.canary.policy
            assert list(policy.steps) == [20, 100]
            assert (policy.step_min_s, policy.step_min_requests) == (600, 7)
            assert policy.max_error_ratio == pytest.approx(0.05)
        finally:
            await agent.stop()


async def test_apply_refuses_files_it_cannot_use(tmp_path: Path) -> None:
    """Two files naming one model, a file that is not a model, an empty folder: exit 64,
    nothing written."""
    async with running_fleet(tmp_path, liveness=PATIENT) as (fleet, _stub):
        twice = tmp_path / "twice"
        twice.mkdir()
        write_model(twice / "a.yaml", name="m")
        write_model(twice / "b.yaml", name="m")
        bad = tmp_path / "bad.yaml"
        bad.write_text("- just\n- a list\n")
        empty = tmp_path / "empty"
        empty.mkdir()
        for target, says in ((twice, "also in"), (bad, "one mapping"), (empty, "no .yaml")):
            run = await ctl(fleet.port, "apply", "-f", str(target))
            assert run.code == 64, (target, run.err)
            assert says in run.err and "Traceback" not in run.err
        listed = await ctl(fleet.port, "model", "list", "-o", "json")
        assert listed.json() == {"models": []}


async def test_output_formats(tmp_path: Path) -> None:
    """-o yaml parses and carries default-valued fields; -o name, -o wide, -o jsonpath and
    --json (the same as -o json) print as kubectl's do; -o given before the command holds."""
    path = write_model(tmp_path / "m.yaml", name="qwen")
    async with running_fleet(tmp_path, liveness=PATIENT) as (fleet, _stub):
        assert (await ctl(fleet.port, "model", "create", str(path))).code == 0
        as_yaml = await ctl(fleet.port, "model", "list", "-o", "yaml")
        assert as_yaml.code == 0, as_yaml.err
        data = yaml.safe_load(as_yaml.out)
        profile = data["models"][0]["model"]["profiles"][0]
        assert profile["cpu_only"] is False and profile["tp"] == 0  # defaults are printed
        as_json = await ctl(fleet.port, "model", "list", "--json")
        before = await ctl(fleet.port, "-o", "json", "model", "list")
        assert as_json.json() == data == before.json()
        name = await ctl(fleet.port, "model", "show", "qwen", "-o", "name")
        assert name.out == "model/qwen\n"
        template = "jsonpath={.models[*].model.name}:{.models[0].revision}"
        path_ = await ctl(fleet.port, "model", "list", "-o", template)
        assert path_.out == "qwen:1\n"
        wide = await ctl(fleet.port, "model", "list", "-o", "wide")
        assert wide.out.splitlines()[0].split()[-4:] == ["ETAG", "CHANGED", "BY", "CHANGED"]
        rollouts = await ctl(fleet.port, "rollout", "list", "-o", "yaml")
        assert yaml.safe_load(rollouts.out) == []
        nodes = await ctl(fleet.port, "node", "list", "-o", "jsonpath={.nodes}")
        assert nodes.code == 0 and nodes.out.strip() == "[]"
        refused = await ctl(fleet.port, "model", "show", "nope", "-o", "yaml")
        assert refused.code == 2
        assert yaml.safe_load(refused.out)["error"]["reason"] == "MODEL_NOT_FOUND"


async def test_a_refused_model_does_not_stop_the_others(tmp_path: Path) -> None:
    """A model the fleet refuses (declared in the cluster settings, hence read-only) is
    reported refused with its reason; the other model is still created; exit 2. The models
    can come on stdin (`-f -`)."""
    declared = yaml.safe_load(write_model(tmp_path / "declared.yaml", name="fixed").read_text())
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"models": [declared]}))
    changed = dict(declared, context_length=4096)
    fresh = yaml.safe_load(write_model(tmp_path / "fresh.yaml", name="fresh").read_text())
    text = yaml.safe_dump_all([changed, fresh])
    async with running_fleet(tmp_path, settings=str(settings), liveness=PATIENT) as (fleet, _s):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmgw.cli.main",
            "ctl",
            "--fleet",
            f"127.0.0.1:{fleet.port}",
            "apply",
            "-f",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_env(),
        )
        out, err = await asyncio.wait_for(proc.communicate(text.encode()), 60)
        assert proc.returncode == 2, err.decode()
        lines = out.decode().splitlines()
        assert lines[0].startswith("model/fixed refused (")
        assert lines[1] == "model/fresh created"
        names = await ctl(fleet.port, "model", "list", "-o", "name")
        assert sorted(names.out.splitlines()) == ["model/fixed", "model/fresh"]
