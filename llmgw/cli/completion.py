"""`llmgw completion bash|zsh|fish`: a shell completion script for the whole command tree,
made from the parser itself (so it never lags behind a new command or flag).

Load it with `source <(llmgw completion bash)` (bash; zsh the same with `zsh`), or `llmgw
completion fish | source`. It completes command names and each command's flags; a flag's
value is left to the shell's own file completion.
"""

from __future__ import annotations

import argparse
from typing import Any

from llmgw.cli.common import example

SHELLS = ("bash", "zsh", "fish")


def command_tree(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], list[str]]:
    """Each command path (`()`, `("ctl",)`, `("ctl", "model")`, ...) and the words that may
    follow it: its subcommands, then its flags."""
    tree: dict[tuple[str, ...], list[str]] = {}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        words: list[str] = []
        flags: list[str] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    words.append(name)
                    walk(child, (*path, name))
            elif action.help != argparse.SUPPRESS:
                flags.extend(o for o in action.option_strings if o.startswith("--"))
        tree[path] = words + flags

    walk(parser, ())
    return tree


def _key(path: tuple[str, ...]) -> str:
    return " ".join(path)


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion function of `llmgw` and its `complete` line."""
    tree = command_tree(parser)
    paths = [p for p in tree if p]
    known = "|".join(f'"{_key(p)}"' for p in sorted(paths))
    cases = "\n".join(f'        "{_key(p)}") words="{" ".join(tree[p])}" ;;' for p in sorted(tree))
    return f"""# llmgw completion for bash: source <(llmgw completion bash)
_llmgw() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" next w i words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        next="${{path:+$path }}$w"
        case "$next" in
            {known}) path="$next" ;;
        esac
    done
    case "$path" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _llmgw llmgw
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """zsh's: the bash function through zsh's bashcompinit."""
    return (
        "# llmgw completion for zsh: source <(llmgw completion zsh)\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)
    )


def fish_script(parser: argparse.ArgumentParser) -> str:
    """fish's: one `complete` line per command path, conditioned on the path typed so far."""
    tree = command_tree(parser)
    paths = "\n".join(f"        case '{_key(p)}'" for p in sorted(p for p in tree if p))
    lines = [
        "# llmgw completion for fish: llmgw completion fish | source",
        "function __llmgw_path",
        "    set -l path ''",
        "    for w in (commandline -opc)[2..-1]",
        "        string match -q -- '-*' $w; and continue",
        '        set -l next (string trim -- "$path $w")',
        "        switch $next",
        paths,
        "                set path $next",
        "        end",
        "    end",
        "    echo $path",
        "end",
    ]
    for path in sorted(tree):
        words = tree[path]
        subs = [w for w in words if not w.startswith("-")]
        flags = [w[2:] for w in words if w.startswith("--")]
        cond = f"test (__llmgw_path) = '{_key(path)}'"
        if subs:
            lines.append(f"complete -c llmgw -f -n \"{cond}\" -a '{' '.join(subs)}'")
        for flag in flags:
            lines.append(f'complete -c llmgw -n "{cond}" -l {flag}')
    return "\n".join(lines) + "\n"


def add_parser(sub: Any, root: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add `completion SHELL` to the `llmgw` parser's subcommands; `root` is the tree it
    completes."""
    cmd: argparse.ArgumentParser = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Print the completion script of a shell for llmgw's commands and flags.",
        epilog=example(
            "source <(llmgw completion bash)",
            "source <(llmgw completion zsh)",
            "llmgw completion fish | source",
        ),
    )
    cmd.add_argument("shell", choices=SHELLS, help="the shell to complete in")

    def run(opts: argparse.Namespace) -> int:
        make = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[opts.shell]
        print(make(root), end="")
        return 0

    cmd.set_defaults(run=run)
    return cmd
