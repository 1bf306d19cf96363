"""llama.cpp's llama-server: its flag grammar (`grammar`), its cache (`cache`), its compute
buffers (`overhead`) and the engine the registry holds (`engine`)."""

from llmgw.engines.llamacpp.cache import LlamaCppCache, llamacpp_cache, llamacpp_kv_bytes
from llmgw.engines.llamacpp.engine import LLAMACPP, LlamaCpp
from llmgw.engines.llamacpp.grammar import (
    LLAMACPP_VERSION,
    MIB,
    CacheType,
    FlashAttn,
    LlamaCppSettings,
    settings_from_args,
)
from llmgw.engines.llamacpp.overhead import LLAMACPP_RESERVE_BYTES, llamacpp_overhead_bytes

__all__ = [
    "LLAMACPP",
    "LLAMACPP_RESERVE_BYTES",
    "LLAMACPP_VERSION",
    "MIB",
    "CacheType",
    "FlashAttn",
    "LlamaCpp",
    "LlamaCppCache",
    "LlamaCppSettings",
    "llamacpp_cache",
    "llamacpp_kv_bytes",
    "llamacpp_overhead_bytes",
    "settings_from_args",
]
