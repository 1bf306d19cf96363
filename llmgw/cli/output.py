"""How `llmgw` prints the services' answers: for people (tables, ages, changes, shapes and
rollouts), and as `-o` asks (`Printer`): JSON or YAML of the answers' own data
(llmgw.clients.convert.as_data, every field shown, defaults too), kubectl's JSONPath, `name`
(kind/name lines) or `wide` (a table with more columns).

Every text for people goes through `say`, the one place printed values pass on their way to
the terminal."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from llmgw.cli import jsonpath
from llmgw.cli.common import GIB, OutputFormat, output_of
from llmgw.cli.progress import progress_text
from llmgw.clients.convert import (
    BatchFit,
    ContextChange,
    GPUsChange,
    Model,
    ModelShape,
    Profile,
    Replica,
    Rollout,
    RolloutEvent,
    enum_name,
    enum_names,
)
from llmgw.text import escaped


def cell(value: object) -> str:
    """A value as one line of text: every control a service's text may hold (newlines too)
    written as a visible escape (llmgw.text.escaped)."""
    return escaped(str(value))


def say(text: str = "", end: str = "\n") -> None:
    """Print a line for people (flushed: a followed rollout's lines show as they come). What
    `llmgw ctl` and `llmgw plan` print reaches the terminal through llmgw.cli.terminal's
    escaping stream (set up in llmgw.cli.main); `cell` also escapes newlines in a table cell."""
    print(text, end=end, flush=True)


def dump(data: Any, told: OutputFormat, stream: bool = False) -> str:
    """`data` in the machine format `told` names: JSON (one line in a stream), YAML (a `---`
    document in a stream), or a JSONPath template's text."""
    if told.kind == "yaml":
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False)
        return ("---\n" + text if stream else text).rstrip("\n")
    if told.kind == "jsonpath":
        return jsonpath.render(list(told.template), data)
    return json.dumps(data, indent=None if stream else 2)


@dataclass(frozen=True)
class Printer:
    """How one command prints its answer, as its `-o` says."""

    told: OutputFormat | None

    @property
    def machine(self) -> bool:
        """Whether the answer is printed as data rather than for people."""
        return self.told is not None and self.told.machine

    def show(
        self,
        data: Any,
        human: Callable[[], None],
        names: Sequence[str],
        wide: Callable[[], None] | None = None,
    ) -> None:
        """Print an answer: `data` in a machine format, `names` (kind/name) for `-o name`,
        `wide` (else `human`) for `-o wide`, `human` otherwise."""
        kind = self.told.kind if self.told is not None else ""
        if self.machine:
            assert self.told is not None
            say(dump(data, self.told))
        elif kind == "name":
            for name in names:
                say(name)
        elif kind == "wide" and wide is not None:
            wide()
        else:
            human()

    def event(self, data: Any, line: str | None) -> None:
        """Print one item of a stream: as data, else `line` (None: nothing for people)."""
        if self.machine:
            assert self.told is not None
            say(dump(data, self.told, stream=True))
        elif line is not None:
            say(line)


def printer(opts: Any) -> Printer:
    """The printer a command's `-o` asks for."""
    return Printer(output_of(opts))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows in left-aligned columns under upper-case headers; the last column is not padded.
    Cells are escaped (`cell`): a value cannot break a row or reach the terminal as a control."""
    cells = [[str(h).upper() for h in headers]] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        lines.append("  ".join([*parts, row[-1]]).rstrip())
    return "\n".join(lines)


def short_name(message: Any, field: str, prefix: str) -> str:
    """An enum field's value without its prefix: REPLICA_PHASE_READY -> READY."""
    return enum_name(message, field).removeprefix(prefix)


def age(ts: Any, now_s: float | None = None) -> str:
    """How long ago a protobuf Timestamp was, for people: 42s, 3m, 5h, 2d; '-' when unset."""
    seconds = ts.seconds + ts.nanos / 1e9
    if seconds <= 0:
        return "-"
    delta = max(0.0, (time.time() if now_s is None else now_s) - seconds)
    if delta < 120:
        return f"{delta:.0f}s"
    if delta < 7200:
        return f"{delta / 60:.0f}m"
    if delta < 172800:
        return f"{delta / 3600:.0f}h"
    return f"{delta / 86400:.0f}d"


def when(ts: Any) -> str:
    """A protobuf Timestamp as local ISO time to the second; '-' when unset."""
    seconds = ts.seconds + ts.nanos / 1e9
    if seconds <= 0:
        return "-"
    return dt.datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def gib(n: int) -> str:
    """Bytes as GiB with one decimal."""
    return f"{n / GIB:.1f}"


def profiles_summary(model: Model) -> str:
    """Each profile as name=engine×replicas."""
    return ", ".join(f"{p.name}={p.engine}×{p.replicas}" for p in model.profiles) or "-"


def cards_of(p: Profile) -> str:
    """A profile's cards for people: `2×H100-80GB (tp 2)` or `CPU, 16 GB RAM`."""
    if p.cpu_only or not p.gpu_class:
        return f"CPU, {p.min_memory_gb} GB RAM" if p.min_memory_gb else "CPU"
    # A replica on several nodes takes its cards a node on each (its tp may span them).
    count = (
        p.gpus_per_node if p.nodes > 1 and p.gpus_per_node > 0 else max(p.gpus_per_node, p.tp, 1)
    )
    extra = [f"tp {p.tp}"] if p.tp else []
    extra += [f"pp {p.pp}"] if p.pp else []
    extra += [f"{p.nodes} nodes"] if p.nodes > 1 else []
    return f"{count}×{p.gpu_class}" + (f" ({', '.join(extra)})" if extra else "")


REPLICA_HEADERS = (
    "id",
    "model",
    "profile",
    "node",
    "cards",
    "phase",
    "address",
    "restarts",
    "age",
    "progress",
    "reason",
)


def replica_rows(replicas: Sequence[Replica]) -> list[list[object]]:
    """Replica table rows, in REPLICA_HEADERS' order."""
    return [
        [
            r.id,
            r.model,
            r.profile,
            # A gang's nodes and cards by rank, the head first: node-a+node-b, 0,1+0,1.
            "+".join(m.node for m in r.members) if r.members else (r.node or "-"),
            "+".join(",".join(str(g) for g in m.gpus) for m in r.members)
            if r.members
            else (",".join(str(g) for g in r.gpus) or "-"),
            short_name(r, "phase", "REPLICA_PHASE_"),
            r.address or "-",
            r.restarts,
            age(r.since),
            progress_text(r),
            r.reason or "",
        ]
        for r in replicas
    ]


def print_context_change(change: ContextChange) -> None:
    """A context change for people: the new context, then each profile's change."""
    say(f"{change.model}: context {change.before} -> {change.after} tokens", end="")
    say(f" (max output {change.max_output}", end="")
    say(f", trained {change.trained})" if change.trained else ")")
    _print_profiles(change)


def print_gpus_change(change: GPUsChange) -> None:
    """A card-count change for people: the cards a replica, then each profile's change."""
    say(f"{change.model}: {change.gpus} cards a replica")
    _print_profiles(change)


def print_batches(batches: Sequence[BatchFit]) -> None:
    """Per profile sized for a batch: whether that many concurrent requests fit, and how many
    of that context the KV pool holds."""
    for b in batches:
        verdict = "fits" if b.fits else "does not fit"
        say(
            f"  batch of {b.sequences} x {b.tokens} tokens on {b.profile} ({b.engine}, "
            f"{b.flag}): {verdict}; the pool holds {b.contexts_held} at that length"
        )


def _gib_text(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _print_profiles(change: ContextChange | GPUsChange) -> None:
    """Per profile, args before -> after and memory per card; then the change's note."""
    for p in change.profiles:
        say(f"  profile {p.profile} ({p.engine})")
        if p.before or p.after:
            say(f"    memory: {p.before or '?'} -> {p.after or '?'}")
        if p.HasField("memory") and p.memory.cards:
            m = p.memory
            say(
                f"    per card: {_gib_text(m.per_card_bytes)} of {_gib_text(m.budget_bytes)} "
                f"budget (weights {_gib_text(m.weights_bytes)}, KV {_gib_text(m.kv_bytes)} a "
                f"replica, {m.cards} card{'s' if m.cards != 1 else ''})"
            )
        say(f"    args: {cell(' '.join(p.args_before)) or '(none)'}")
        say(f"       -> {cell(' '.join(p.args)) or '(none)'}")
    if change.note:
        say(f"  note: {change.note}")


def print_shape(shape: ModelShape, version: str) -> None:
    """A resolved shape for people."""
    kinds: dict[str, int] = {}
    for k in enum_names(shape, "layer_kinds"):
        name = k.removeprefix("LAYER_KIND_").lower()
        kinds[name] = kinds.get(name, 0) + 1
    rows = [
        ("architecture", shape.architecture),
        ("format", shape.format),
        ("layers", f"{shape.layers} ({', '.join(f'{v} {k}' for k, v in kinds.items())})"),
        ("attention heads", shape.attention_heads),
        ("KV heads", shape.kv_heads),
        ("head dims (K/V)", f"{shape.head_dim_k}/{shape.head_dim_v}"),
        ("sliding window", shape.sliding_window or "-"),
        ("trained context", shape.trained_context or "unknown"),
        ("weights", f"{shape.weights_bytes} B ({_gib_text(shape.weights_bytes)})"),
        ("KV per token", f"{shape.kv_bytes_per_token} B"),
        ("KV fixed (windows)", f"{shape.kv_bytes_fixed} B"),
        ("state per sequence", f"{shape.state_bytes_per_sequence} B"),
        ("llama.cpp modelled", version),
    ]
    for key, value in rows:
        say(f"{key:>20}: {value}")
    for note in shape.notes:
        say(f"{'note':>20}: {note}")


def rollout_state(ro: Rollout) -> str:
    """A rollout's state for people: running, succeeded, failed, ..."""
    return short_name(ro, "state", "ROLLOUT_STATE_").lower()


def print_rollout(ro: Rollout) -> None:
    """A rollout for people: state, revisions, a line per step, why it ended."""
    strategy = short_name(ro, "strategy", "STRATEGY_").lower()
    say(
        f"rollout {ro.id} of {ro.model} ({ro.kind}, {strategy}): {rollout_state(ro)}, "
        f"revision {ro.from_revision} -> {ro.to_revision}"
    )
    for s in ro.steps:
        where = f" on {s.node} cards {','.join(map(str, s.gpus))}" if s.node else ""
        mode = mode_name(s)
        say(
            f"  [{s.profile}] {s.old_replica or '(new)'} -> {s.new_replica or '?'}"
            f"{where}: {stage_name(s)}{' ' + mode if mode else ''}"
        )
    if ro.HasField("canary"):
        c = ro.canary
        steps = "/".join(str(p) for p in c.policy.steps)
        where = "promoted" if c.promoted else f"step {c.step + 1} of {steps} %"
        verdict = short_name(c, "verdict", "CANARY_VERDICT_").lower()
        say(
            f"  canary: {where}, new revision {c.weight_percent} %, {verdict}; canary "
            f"{c.canary.requests} requests {100 * c.canary.error_ratio:.2f} % errors, baseline "
            f"{c.baseline.requests} requests {100 * c.baseline.error_ratio:.2f} % errors"
        )
        for finding in c.findings:
            say(f"    {finding}")
    if ro.reason:
        say(f"  reason: {ro.reason}")
    if ro.HasField("failure"):
        meta = ", ".join(f"{k}={v}" for k, v in sorted(ro.failure.metadata.items()))
        say(f"  failure: {ro.failure.reason}" + (f" ({meta})" if meta else ""))
    for line in ro.log_tail:
        say(f"  | {line}")


def stage_name(step: Any) -> str:
    """A rollout step's stage for people: waiting, starting, retiring, done, failed, ..."""
    return short_name(step, "stage", "ROLLOUT_STAGE_").lower()


def mode_name(message: Any) -> str:
    """A step's or event's mode for people: beside, in_place, or "" when not decided."""
    if not message.mode:
        return ""
    return short_name(message, "mode", "ROLLOUT_MODE_").lower()


def event_line(ev: RolloutEvent) -> str:
    """One rollout event for people: when, what, which replica on which node and cards."""
    at = time.strftime("%H:%M:%S", time.localtime(ev.at.seconds))
    where = ""
    if ev.node:
        where = f" on {ev.node}"
        if ev.gpus:
            where += f" cards {','.join(map(str, ev.gpus))}"
    who = f" {ev.replica_id}" if ev.replica_id else ""
    mode = mode_name(ev)
    how = f" ({mode})" if mode else ""
    profile = f" [{ev.profile}]" if ev.profile else ""
    msg = f": {ev.message}" if ev.message else ""
    kind = short_name(ev, "kind", "ROLLOUT_EVENT_KIND_").lower().replace("_", " ")
    return f"{at} {kind}{profile}{who}{where}{how}{msg}"
