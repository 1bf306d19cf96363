"""`llmgw completion bash|zsh|fish`: the bash script loads in a real bash and completes the
command tree; the others name every command."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

BASH = shutil.which("bash")


def _complete(words: list[str]) -> list[str]:
    """What the loaded script offers for the last of `words` (bash's own compgen)."""
    assert BASH is not None
    script = f"{sys.executable} -m llmgw.cli.main completion bash"
    quoted = " ".join(f"'{w}'" for w in words)
    program = (
        f"source <({script}) || exit 9\n"
        "complete -p llmgw || exit 8\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
        "_llmgw\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "complete -o default -F _llmgw llmgw"
    return lines[1:]


@pytest.mark.skipif(BASH is None, reason="no bash here")
def test_bash_script_loads_and_completes_commands() -> None:
    """Sourced in bash, `complete -p llmgw` names its function, which offers the commands,
    a group's commands, and a command's own flags."""
    assert _complete(["llmgw", "c"]) == ["ctl", "certs", "completion"]
    assert _complete(["llmgw", "ctl", "mo"]) == ["model"]
    assert _complete(["llmgw", "ctl", "--fleet", "h:1", "model", "hi"]) == ["history"]
    assert "--output" in _complete(["llmgw", "ctl", "model", "list", "--"])
    assert _complete(["llmgw", "ctl", "apply", "--dr"]) == ["--dry-run"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_name_the_commands(shell: str) -> None:
    """zsh's script goes through bashcompinit; fish's has a line per command path."""
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    if shell == "zsh":
        assert "bashcompinit" in done.stdout
        assert "complete -o default -F _llmgw llmgw" in done.stdout
    else:
        assert "test (__llmgw_path) = 'ctl model'" in done.stdout
        assert "-a 'list show create update delete history gpus context'" in done.stdout
    fish = shutil.which("fish")
    if shell == "fish" and fish:
        subprocess.run([fish, "-n", "-c", done.stdout], check=True, timeout=60)
