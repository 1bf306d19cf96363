"""vLLM's `--cpu-offload-gb`: decoder-layer weights kept in the host's pinned memory.

What vLLM does (vllm/model_executor/models/utils.py, `maybe_offload_to_cpu` and `make_layers`,
read at the 0.7-0.10 line; `set_cpu_offload_max_bytes` is given `cpu_offload_gb * 1024**3`
for each worker, so the budget is GiB per card):

- `make_layers` passes each decoder layer, first to last, to `maybe_offload_to_cpu`, which
  moves its parameters to the CPU one by one until the card's budget is spent. The token
  embeddings and the head are not built by `make_layers`, so they stay on the card.
- Under V0 (`uva_offloading` False) an offloaded layer's forward copies its parameters back to
  the card (`v.to(device)` for its whole state dict) and runs on the copies, which live for
  that layer's forward: the profile run's peak holds one layer's weights on top of the
  forward pass's own tensors.
- Under V1 the parameters become CUDA views of the pinned host memory (UVA), read in place:
  no copy is made, so the peak does not grow.

The planner takes the offload per card, as vLLM does, out of the card's weights, up to the
weights of its decoder layers (the card's share of the checkpoint less its share of the
embeddings and head: EMBEDDING_COPIES of vocabulary × hidden × 2 bytes, counted untied, so a
tied model's layers come out smaller and less is taken off: the safe side). Whole parameters
move, so vLLM can offload a little past the budget; the planner takes the budget itself, so
its card weights may be high by part of one parameter, again the safe side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llmgw.cardclass import GIB
from llmgw.engines.grammar import Grammar
from llmgw.engines.torch_overhead import layers_per_stage
from llmgw.shape import ModelShape

CPU_OFFLOAD_GB = ("--cpu-offload-gb",)

EMBEDDING_COPIES = 2
"""The token embeddings and the head, each vocabulary × hidden, neither built by `make_layers`
(counted as two even for a model that ties them: see the module's docstring)."""

EMBEDDING_ELEMENT_BYTES = 2
"""bf16/fp16: quantized checkpoints (AWQ, GPTQ, fp8) keep the embeddings and head unquantized."""


def offload_budget_bytes(grammar: Grammar, args: Sequence[str]) -> int:
    """`--cpu-offload-gb` in bytes (GiB, as vLLM multiplies by 1024**3); 0 when absent.

    Raises:
        EngineRefuses: a value that is not a number of at least 0.
    """
    raw = grammar.get(args, CPU_OFFLOAD_GB)
    if raw is None:
        return 0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1 << 20:
        raise grammar.refuse(
            f"{grammar.engine} refuses {CPU_OFFLOAD_GB[0]} {raw!r}: give the GiB of weights to "
            "keep in host memory, a number of at least 0",
            f"{CPU_OFFLOAD_GB[0]}={raw}",
        )
    return int(value * GIB)


def layer_weights_per_card(shape: ModelShape, tp: int, pp: int) -> int:
    """The card's share of the decoder layers' weights: its share of the checkpoint less its
    share of the embeddings and head (weights spread evenly, as the rest of the sizing has
    them)."""
    cards = max(tp * pp, 1)
    compute = shape.compute
    embeddings = (
        EMBEDDING_COPIES * compute.vocab_size * compute.hidden_size * EMBEDDING_ELEMENT_BYTES
        if compute is not None
        else 0
    )
    return max(-(-shape.weights_bytes // cards) - -(-embeddings // cards), 0)


def offloaded_per_card(
    grammar: Grammar, shape: ModelShape, args: Sequence[str], tp: int, pp: int
) -> int:
    """The weights vLLM keeps in host memory for each card: the budget, up to the card's
    decoder layers."""
    budget = offload_budget_bytes(grammar, args)
    if budget <= 0:
        return 0
    return min(budget, layer_weights_per_card(shape, tp, pp))


def v0_offload_copy_bytes(
    grammar: Grammar, shape: ModelShape, args: Sequence[str], tp: int, pp: int
) -> int:
    """What V0's profile run holds at its peak for an offloaded layer's copy: one layer's
    share of the card's weights (all of it offloaded once the budget covers a layer)."""
    offloaded = offloaded_per_card(grammar, shape, args, tp, pp)
    if offloaded <= 0:
        return 0
    layers = max(layers_per_stage(shape, pp), 1)
    return min(offloaded, -(-layer_weights_per_card(shape, tp, pp) // layers))
