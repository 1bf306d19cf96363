"""Splitting a replica that spans nodes (a gang) into tensor × pipeline parallel ranks.

vLLM and SGLang start one rank per card, and their world is tensor × pipeline parallel:
vLLM's `ParallelConfig.world_size = pipeline_parallel_size * tensor_parallel_size`
(vllm/config/parallel.py), and across nodes each of its `nnodes` nodes runs world ÷ nnodes
of those ranks; SGLang's `tp_size` and `pp_size` (sglang/srt/server_args.py) are the whole
replica's, shared over `--nnodes` nodes. So a gang of N nodes with C cards each must run
tp × pp = N × C, or the engine refuses it at start (the stand-in checks the same).

The rule, for C cards on each of N nodes (world W = N × C):

1. A profile whose tensor parallel already spans its nodes (its arguments ran tp = the whole
   world, pp 1) keeps that layout first: tp = W, pp = 1.
2. Otherwise tensor parallel stays within a node, where the cards talk over NVLink rather than
   the network: tp = C, pp = N (one pipeline stage a node).
3. When that tp fails the tensor-parallel checks (`heads.tp_failure`), the next smaller
   divisor d of C that passes: tp = d, pp = W ÷ d (several stages a node).

A split is taken only when its tp passes every tensor-parallel check of the engine and every
stage holds at least one decoder layer (a stage of no layers would hold nothing to run). When
none does, the gang is refused with each split's reason and the per-node counts that split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.shape import ModelShape


@dataclass(frozen=True)
class Split:
    """A gang's ranks: `tp` × `pp` over `nodes` nodes of `gpus_per_node` cards."""

    nodes: int
    gpus_per_node: int
    tp: int
    pp: int

    @property
    def world(self) -> int:
        """Ranks of the whole replica (one a card)."""
        return self.tp * self.pp

    @property
    def tp_across_nodes(self) -> bool:
        """Whether a tensor parallel group spans more than one node."""
        return self.tp > self.gpus_per_node


@dataclass(frozen=True)
class SplitAnswer:
    """The split chosen (None: none works), the reason each split tried was passed over."""

    split: Split | None
    refused: tuple[tuple[Split, str], ...] = ()
    preferred: Split | None = None

    def refusals(self) -> str:
        """Each split passed over and why, in words."""
        return "; ".join(f"tp {s.tp} x pp {s.pp}: {why}" for s, why in self.refused)


def candidates(nodes: int, gpus_per_node: int, *, tp_across: bool) -> list[Split]:
    """The splits of `nodes` × `gpus_per_node` cards tried, best first (the module's rule)."""
    world = nodes * gpus_per_node
    out = [Split(nodes, gpus_per_node, world, 1)] if tp_across else []
    for d in range(gpus_per_node, 0, -1):
        if gpus_per_node % d == 0:
            out.append(Split(nodes, gpus_per_node, d, world // d))
    return out


def failure(
    engine: TensorParallelEngine, split: Split, shape: ModelShape | None, args: Sequence[str]
) -> str | None:
    """Why the engine would not run `split` (None: it would; heads unchecked without a shape)."""
    if split.pp > 1 and not engine.pp_flag:
        return f"{engine.name} has no pipeline parallel flag"
    if shape is None:
        return None
    failed = engine.tp_failure(split.tp, shape, args)
    if failed:
        return failed
    layers = shape.block_count
    if layers and split.pp > layers:
        return f"{split.pp} pipeline stages is more than its {layers} layers"
    return None


def choose(
    engine: TensorParallelEngine,
    shape: ModelShape | None,
    args: Sequence[str],
    *,
    nodes: int,
    gpus_per_node: int,
    tp_across: bool,
) -> SplitAnswer:
    """The first split of the rule the engine would run, and the ones passed over."""
    tried = candidates(nodes, gpus_per_node, tp_across=tp_across)
    refused: list[tuple[Split, str]] = []
    for split in tried:
        why = failure(engine, split, shape, args)
        if why is None:
            return SplitAnswer(split, tuple(refused), tried[0])
        refused.append((split, why))
    return SplitAnswer(None, tuple(refused), tried[0] if tried else None)


def asks_tp_across(
    engine: TensorParallelEngine, args: Sequence[str], nodes: int, cards: int
) -> bool:
    """Whether a gang's arguments now run tensor parallel over its whole world (pp 1) on
    `nodes` nodes of `cards` cards each: the layout it asked for."""
    tp, pp = engine.tensor_parallel(args, nodes * cards)
    return nodes > 1 and pp == 1 and tp == nodes * cards


def counts_that_split(
    engine: TensorParallelEngine,
    shape: ModelShape | None,
    args: Sequence[str],
    *,
    nodes: int,
    largest: int,
    tp_across: bool,
) -> tuple[int, ...]:
    """The per-node card counts from 1 to `largest` some split of the rule runs."""
    return tuple(
        c
        for c in range(1, largest + 1)
        if choose(engine, shape, args, nodes=nodes, gpus_per_node=c, tp_across=tp_across).split
    )


def with_split(engine: TensorParallelEngine, args: Sequence[str], split: Split) -> list[str]:
    """`args` running `split`: the tensor parallel flag set to its tp and the pipeline flag to
    its pp (written only when pp > 1 or the flag is already there), where they stood."""
    out = engine.with_cards(args, split.tp)
    if not engine.pp_flag:
        return out
    if split.pp > 1 or engine.grammar.get(out, engine.pp_flag) is not None:
        out = engine.grammar.set(out, engine.pp_flag, str(split.pp))
    return out


__all__ = [
    "Split",
    "SplitAnswer",
    "asks_tp_across",
    "candidates",
    "choose",
    "counts_that_split",
    "failure",
    "with_split",
]
