"""A GGUF's tensor bytes by the llama.cpp layer each belongs to (llmgw.shape.WeightsLayout),
from the tensor infos' sizes."""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.shape import WeightsLayout
from planner_svc.domain.errors import InvalidShape

# src/llama-arch.cpp LLM_TENSOR_INFOS: the layer each tensor outside the blocks belongs to.
_INPUT_TENSORS = frozenset(
    {"token_embd", "token_embd_norm", "token_types", "position_embd", "per_layer_token_embd"}
)
_OUTPUT_TENSORS = frozenset(
    {"output", "output_norm", "cls", "cls_out", "enc_output_norm", "dec_output_norm"}
)
# Created for every repeating layer with TENSOR_DUPLICATED (src/llama-model.cpp load_tensors:
# `rope_freqs` "i != 0 ? TENSOR_DUPLICATED : 0"), so each layer's device holds a copy.
_PER_LAYER_TENSORS = frozenset({"rope_freqs", "rope_factors_long", "rope_factors_short"})


def weights_layout(
    n_layer: int,
    block_bytes: Mapping[int, int],
    named_bytes: Mapping[str, int],
    source: str = "",
) -> WeightsLayout:
    """The tensor bytes by llama.cpp layer (`llmgw.shape.WeightsLayout`).

    Raises:
        InvalidShape: a block tensor past `block_count` (llama.cpp refuses such a file: it
            would not be loaded), or a negative size.
    """
    past = [i for i in block_bytes if i >= n_layer or i < 0]
    if past:
        raise InvalidShape(
            message=f"The GGUF holds tensors of block {min(past)} but its block_count is "
            f"{n_layer}; llama.cpp would refuse the file (wrong number of tensors).",
            source=source,
        )
    if any(b < 0 for b in (*block_bytes.values(), *named_bytes.values())):
        raise InvalidShape(message="Tensor sizes cannot be negative.", source=source)
    inputs = outputs = copies = 0
    for name, nbytes in named_bytes.items():
        base = name.split(".", 1)[0]
        if base in _OUTPUT_TENSORS:
            outputs += nbytes
        elif base in _PER_LAYER_TENSORS:
            copies += nbytes
        else:
            inputs += nbytes  # input-layer tensors, and names the table does not list
    # A head tied to the token embeddings: llama.cpp loads token_embd.weight again as the
    # output tensor (TENSOR_DUPLICATED, re-classified as LLM_TENSOR_OUTPUT by the loader).
    tied = "output.weight" not in named_bytes and "token_embd.weight" in named_bytes
    return WeightsLayout(
        layer_bytes=tuple(block_bytes.get(i, 0) for i in range(n_layer)),
        input_bytes=inputs,
        output_bytes=outputs,
        per_layer_copy_bytes=copies,
        head_copy_bytes=named_bytes["token_embd.weight"] if tied else 0,
    )
