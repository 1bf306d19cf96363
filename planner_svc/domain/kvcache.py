"""The KV cache a replica allocates, through its engine: the whole cache for a pool of tokens,
and what one cached token takes on a card. Each engine's cache rules are its own module's
(llmgw.engines)."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.engines import registry
from llmgw.engines.kvcache import token_bytes_on_card
from llmgw.shape import ModelShape
from planner_svc.domain import errors


def check_pool(tokens: int, sequences: int, tp: int) -> None:
    """Refuse negative pools and counts below one."""
    if tokens < 0:
        raise errors.InvalidRequest(f"a pool of {tokens} tokens is not a size", field="tokens")
    if sequences < 1:
        raise errors.InvalidRequest(f"{sequences} sequences: give at least one", field="slots")
    if tp < 1:
        raise errors.InvalidRequest(f"tensor parallel {tp}: give at least one card", field="gpus")


def kv_cache_bytes(
    engine: str,
    shape: ModelShape,
    *,
    tokens: int,
    sequences: int,
    tp: int,
    args: Sequence[str],
) -> int:
    """The KV cache (and recurrent state) of a whole replica holding a pool of `tokens`.

    Full and MLA layers hold every token; sliding layers what the engine keeps of a window;
    recurrent layers a state per sequence; one-card embedding engines keep none.

    Args:
        engine: a registered engine's name or alias.
        shape: the model's shape.
        tokens: the pool (for vLLM, SGLang and TensorRT-LLM: one request's context).
        sequences: requests the pool is shared by.
        tp: tensor parallel size.
        args: the engine's arguments (cache dtype, block and batch sizes).
    Raises:
        UnknownEngine, EngineRefuses, InvalidRequest.
    """
    check_pool(tokens, sequences, tp)
    return registry.get(engine).kv_cache_bytes(
        shape, tokens=tokens, sequences=sequences, tp=tp, args=args
    )


def kv_bytes_per_token_per_card(
    engine: str, shape: ModelShape, tp: int, args: Sequence[str]
) -> int:
    """What one cached token takes on one card, every KV layer at full width.

    This is the divisor each engine turns free KV memory into tokens with: vLLM's page bytes
    over all layers ÷ block size (its hybrid allocator prints sliding layers' groups at full
    width too: blocks // groups × block size), SGLang's cell size, TensorRT-LLM's "kv size"
    (no sliding discount, gt-052). Recurrent state is not per token and is left out.

    Raises:
        UnknownEngine, EngineRefuses, InvalidRequest.
    """
    check_pool(0, 1, tp)
    eng = registry.get(engine)
    cache_shape = getattr(eng, "cache_shape", None)
    if cache_shape is not None:
        shape = cache_shape(shape, args)
    return token_bytes_on_card(shape, tp, eng.cache_dtype_bytes(args, shape))
