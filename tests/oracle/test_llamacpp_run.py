"""The oracle's reading of llama.cpp's log, on lines llama.cpp printed (no llama.cpp needed).

The log excerpts were printed by llama.cpp 0c1e570 (llama-cpp-python 0.3.36) creating contexts
on the oracle's own models (tests/oracle/models.py) through tests/oracle/llamacpp_run.py.
"""

from __future__ import annotations

import pytest

from tests.oracle.llamacpp_run import KvLine, RsLine, parse_log, printed_mib

# gemma2-swa-300, n_ctx 4096, 2 sequences, unified, q8_0 K and V, flash attention auto, ubatch 128.
GEMMA2_LOG = """\
llama_init_from_model: enabling flash_attn since it is required for quantized V cache
llama_context: n_ctx                 = 4096
llama_context: n_ctx_seq             = 4096
llama_context: n_ubatch              = 128
llama_context: flash_attn            = enabled
llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
llama_kv_cache:        CPU KV buffer size =     4.25 MiB
llama_kv_cache: size =    4.25 MiB (  4096 cells,   2 layers,  2/1 seqs), K (q8_0):    2.12 MiB, \
V (q8_0):    2.12 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells
llama_kv_cache:        CPU KV buffer size =     0.80 MiB
llama_kv_cache: size =    0.80 MiB (   768 cells,   2 layers,  2/1 seqs), K (q8_0):    0.40 MiB, \
V (q8_0):    0.40 MiB
sched_reserve:        CPU compute buffer size =     2.26 MiB
"""

# mamba-128, n_ctx 1000, 3 sequences, per-slot caches.
MAMBA_LOG = """\
llama_context: n_ctx is not divisible by n_seq_max - rounding down to 1536
llama_context: n_ctx                 = 1536
llama_context: n_ctx_seq             = 512
llama_context: n_ubatch              = 512
llama_context: flash_attn            = auto
llama_memory_recurrent:        CPU RS buffer size =     0.17 MiB
llama_memory_recurrent: size =    0.17 MiB (     3 cells,   3 layers,  3 seqs  0 rs_seq), \
R (f32):    0.03 MiB, S (f32):    0.14 MiB, P (f32):    0.00 MiB
resolve_fused_ops: Flash Attention enabled
sched_reserve:        CPU compute buffer size =     3.32 MiB
"""

# llama-gqa-64, q4_0 V cache with flash attention off.
REFUSED_LOG = "llama_init_from_model: quantized V cache requires flash_attn to be enabled\n"


def test_parses_both_caches_of_a_sliding_window_model() -> None:
    """The non-SWA and SWA cache lines are told apart by the line announcing each."""
    printed = parse_log(True, GEMMA2_LOG)
    assert printed.kv == (
        KvLine("base", "4.25", 4096, 2, 2, 1, "q8_0", "2.12", "q8_0", "2.12"),
        KvLine("swa", "0.80", 768, 2, 2, 1, "q8_0", "0.40", "q8_0", "0.40"),
    )
    assert (printed.n_ctx, printed.n_ctx_seq, printed.n_ubatch) == (4096, 4096, 128)
    assert printed.flash_attn is True
    assert printed.compute_mib == {"CPU": 2.26}


def test_parses_recurrent_state_and_auto_flash_attention() -> None:
    """The recurrent line gives cells (one per sequence) and sizes; auto flash attention
    reads as what resolve_fused_ops decided."""
    printed = parse_log(True, MAMBA_LOG)
    assert printed.recurrent == RsLine("0.17", 3, 3, 3, "0.03", "0.14")
    assert not printed.kv
    assert (printed.n_ctx, printed.n_ctx_seq) == (1536, 512)
    assert printed.flash_attn is True


def test_parses_a_refusal() -> None:
    """A context llama.cpp refused carries its printed reason."""
    printed = parse_log(False, REFUSED_LOG)
    assert not printed.ok
    assert printed.error == (
        "llama_init_from_model: quantized V cache requires flash_attn to be enabled"
    )


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (0, "0.00"),
        (1 << 20, "1.00"),
        (2_228_224, "2.12"),  # 2.125 MiB: the tie rounds to even, as printf does
        (419_430, "0.40"),
        (18_432 << 20, "18432.00"),
        (10_968 * (1 << 20) + 786_432, "10968.75"),
    ],
)
def test_printed_mib(n_bytes: int, text: str) -> None:
    """Bytes format as llama.cpp prints MiB: float32, two decimals."""
    assert printed_mib(n_bytes) == text
