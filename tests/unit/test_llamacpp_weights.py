"""llama.cpp's model buffer per device from a GGUF's tensor table, checked against the
ground-truth rows that print it (tests/fixtures/ground_truth/observations.jsonl).

The rows do not carry their files' tensor tables, so each test writes a GGUF whose tensor infos
are the model's as llama.cpp's converter and quantizer lay them out (names, ggml-order shapes,
types: the widths from the model's Hugging Face config.json, the types from the quantization
the row names), reads it with the planner's own header parser and resolver path, and places it
as the row ran. Each printed "model buffer size" must come out to its two decimals of MiB.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gguf import GGMLQuantizationType

from llmgw.engines.llamacpp.placement import (
    CPU,
    layer_devices,
    placement,
    split_points,
    weights_per_device,
)
from llmgw.shape import ModelShape
from planner_svc.domain.gguf_shape import shape_from_gguf
from planner_svc.sources.gguf_http import read_gguf_header
from tests.oracle.llamacpp_run import printed_mib
from tests.support.gguf_files import TensorSpec, write_gguf

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ground_truth" / "observations.jsonl"
ROWS = {
    row["id"]: row
    for row in (json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip())
}
F32, Q4_0, Q6_K, Q8_0 = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.Q8_0,
)


def dense_tensors(
    *,
    layers: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int,
    n_ff: int,
    n_vocab: int,
    matrix: GGMLQuantizationType,
    embd: GGMLQuantizationType,
    head: GGMLQuantizationType,
    qk_norm: bool = False,
) -> list[TensorSpec]:
    """A dense llama-style model's tensor infos (LLM_TENSOR_* names; norms in F32)."""
    out = [
        TensorSpec("token_embd.weight", (n_embd, n_vocab), embd),
        TensorSpec("output_norm.weight", (n_embd,), F32),
        TensorSpec("output.weight", (n_embd, n_vocab), head),
    ]
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(layers):
        out += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,), F32),
            TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, q), matrix),
            TensorSpec(f"blk.{i}.attn_k.weight", (n_embd, kv), matrix),
            TensorSpec(f"blk.{i}.attn_v.weight", (n_embd, kv), matrix),
            TensorSpec(f"blk.{i}.attn_output.weight", (q, n_embd), matrix),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,), F32),
            TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), matrix),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), matrix),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), matrix),
        ]
        if qk_norm:
            out += [
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,), F32),
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,), F32),
            ]
    return out


def read_shape(path: Path, arch: str, tensors: list[TensorSpec], **geometry: int) -> ModelShape:
    """Write the GGUF, read its header as the resolver does, and give its shape."""
    write_gguf(path, arch=arch, tensors=tensors, **geometry)  # type: ignore[arg-type]
    header = asyncio.run(read_gguf_header(str(path)))
    return shape_from_gguf(
        header.metadata,
        file_bytes=header.file_bytes,
        tensor_bytes=header.tensor_bytes,
        block_tensor_bytes=header.tensor_sizes.by_block,
        named_tensor_bytes=header.tensor_sizes.by_name,
    )


def test_llama_70b_q4_0_over_two_devices_as_printed(tmp_path: Path) -> None:
    """gt-002: Llama-3.1-70B Q4_0 (Q6_K head, as llama-quantize writes Q4_0) over two equal
    RPC devices, all layers offloaded: 41 layers on the first, 39 and the output on the second,
    the token embeddings on the CPU; each model buffer as printed. The row's figures match a
    file without rope_freqs (a per-layer copy of it would show in the second decimal)."""
    printed = ROWS["gt-002"]["printed"]
    shape = read_shape(
        tmp_path / "llama-70b-q4_0.gguf",
        "llama",
        dense_tensors(
            layers=80,
            n_embd=8192,
            n_head=64,
            n_head_kv=8,
            head_dim=128,
            n_ff=28672,
            n_vocab=128256,
            matrix=Q4_0,
            embd=Q4_0,
            head=Q6_K,
        ),
        block_count=80,
        n_embd=8192,
        n_head=64,
        n_head_kv=8,
        context_length=131072,
    )
    args = ["--ctx-size", "2048", "-ngl", "999", "--split-mode", "layer"]
    first, second, cpu = placement(shape, args, 2, compute_bytes=0)
    assert (first.layers, second.layers, second.output) == (41, 39, True)
    assert printed_mib(first.weights_bytes) == f"{printed['model_buffer_rpc0_mib']:.2f}"
    assert printed_mib(second.weights_bytes) == f"{printed['model_buffer_rpc1_mib']:.2f}"
    assert printed_mib(cpu.weights_bytes) == f"{printed['model_buffer_cpu_mapped_mib']:.2f}"


def test_qwen3_8b_q8_0_partly_offloaded_as_printed(tmp_path: Path) -> None:
    """gt-001: Qwen3-8B Q8_0 with 19 layers offloaded by the row's older rule (the last 19
    repeating layers; the output layer stays on the CPU): the card's model buffer as printed,
    and the CPU holding the other 17 layers, the embeddings and the head."""
    printed = ROWS["gt-001"]["printed"]
    shape = read_shape(
        tmp_path / "qwen3-8b-q8_0.gguf",
        "qwen3",
        dense_tensors(
            layers=36,
            n_embd=4096,
            n_head=32,
            n_head_kv=8,
            head_dim=128,
            n_ff=12288,
            n_vocab=151936,
            matrix=Q8_0,
            embd=Q8_0,
            head=Q8_0,
            qk_norm=True,
        ),
        block_count=36,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        context_length=40960,
        key_length=128,
        value_length=128,
    )
    where = layer_devices(36, 19, split_points([1.0]), legacy_start=True)
    assert where.count(0) == 19 and where[-1] == CPU
    card, cpu = weights_per_device(shape, where, 1)
    assert printed_mib(card) == f"{printed['model_buffer_cuda0_mib']:.2f}"
    assert printed_mib(cpu) == f"{printed['model_buffer_cpu_mapped_mib']:.2f}"
    assert card + cpu == shape.weights_bytes


def test_a_tied_head_is_copied_to_the_output_layers_device(tmp_path: Path) -> None:
    """A model without output.weight has its token embeddings loaded again as the head on the
    output layer's card, while the CPU keeps them as the input layer; the per-layer
    rope_freqs tensor is on every layer's device."""
    tensors = [
        t
        for t in dense_tensors(
            layers=4,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            head_dim=64,
            n_ff=512,
            n_vocab=1024,
            matrix=Q8_0,
            embd=Q8_0,
            head=Q8_0,
        )
        if t.name != "output.weight"
    ] + [TensorSpec("rope_freqs.weight", (32,), F32)]
    shape = read_shape(
        tmp_path / "tied.gguf",
        "llama",
        tensors,
        block_count=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        context_length=4096,
    )
    layout = shape.weights_layout
    assert layout is not None
    embd = 256 * 1024 // 32 * 34
    assert layout.head_copy_bytes == embd and layout.per_layer_copy_bytes == 128
    first, second, cpu = placement(shape, ["-c", "4096", "-ngl", "99"], 2, compute_bytes=0)
    assert (first.layers, second.layers, second.output) == (3, 1, True)
    assert first.weights_bytes == 3 * (layout.layer_bytes[0] + 128)
    assert second.weights_bytes == layout.layer_bytes[3] + 128 + 256 * 4 + embd
    assert cpu.weights_bytes == embd
