"""Real GGUF files for tests and benches: written with gguf-py's GGUFWriter, sparse when large.

`write_gguf` writes a header for a given geometry (plus any keys and tensor infos) and then
extends the file to its data section's size, or to `pad_to_bytes`, without writing the data:
the filesystem keeps the hole, so a "400 GB" file costs a few megabytes of disk. Tensor data
reads back as zeros unless given in `tensor_data`, which is enough for llama.cpp to load a tiny
model (with a tokenizer from `tokenizer_kv` and tensors from `llama_tensors`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    Keys,
)


class TensorSpec(NamedTuple):
    """A tensor info: `dims` in ggml order (row length first, as llama.cpp prints shapes)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: GGMLQuantizationType


@dataclass(frozen=True)
class Typed:
    """A metadata value with an explicit GGUF type (and item type for arrays)."""

    value: object
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class WrittenGGUF:
    """Where a written file's parts lie: its header ends (aligned) at `header_bytes`."""

    path: Path
    header_bytes: int
    tensor_bytes: int
    file_bytes: int


def tensor_nbytes(dims: Sequence[int], ggml_type: GGMLQuantizationType) -> int:
    """Bytes of a tensor's data: elements / block size x block bytes (gguf GGML_QUANT_SIZES).

    Raises:
        ValueError: the row length is not a multiple of the type's block size.
    """
    block, type_bytes = GGML_QUANT_SIZES[ggml_type]
    if dims and dims[0] % block:
        raise ValueError(f"row of {dims[0]} is not a multiple of {ggml_type.name}'s block {block}")
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * type_bytes


def write_gguf(
    path: str | os.PathLike[str],
    *,
    arch: str,
    block_count: int,
    n_embd: int,
    n_head: int | Sequence[int],
    n_head_kv: int | Sequence[int],
    context_length: int,
    key_length: int | None = None,
    value_length: int | None = None,
    extra_kv: Mapping[str, object] | None = None,
    tensors: Sequence[TensorSpec | tuple[str, tuple[int, ...], GGMLQuantizationType]] = (),
    tensor_data: Mapping[str, bytes] | None = None,
    pad_to_bytes: int = 0,
    alignment: int | None = None,
) -> WrittenGGUF:
    """Write a GGUF v3 file for a model geometry, its data section left sparse.

    Args:
        path: the file to write.
        arch: general.architecture; the geometry keys are written under it.
        block_count, n_embd, context_length: `{arch}.block_count` etc.
        n_head, n_head_kv: head counts, one number or one per layer.
        key_length, value_length: head sizes, written only when given.
        extra_kv: further keys; values are bool/int/float/str/list or `Typed` for an exact
            type (ints are written as UINT32 when they fit, else UINT64/INT32/INT64).
        tensors: tensor infos (name, ggml-order dims, type), laid out contiguously.
        tensor_data: bytes to write for some tensors (at most their size); the rest is a hole.
        pad_to_bytes: extend the file to at least this size (sparsely).
        alignment: general.alignment to write (default: none written, 32 used).
    Returns:
        The written file's layout.
    """
    writer = GGUFWriter(path, arch)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(block_count)
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    _add(writer, Keys.Attention.HEAD_COUNT.format(arch=arch), _listify(n_head))
    _add(writer, Keys.Attention.HEAD_COUNT_KV.format(arch=arch), _listify(n_head_kv))
    if key_length is not None:
        writer.add_key_length(key_length)
    if value_length is not None:
        writer.add_value_length(value_length)
    for key, value in (extra_kv or {}).items():
        _add(writer, key, value)

    specs = [TensorSpec(*t) for t in tensors]
    tensor_bytes = 0
    for spec in specs:
        nbytes = tensor_nbytes(spec.dims, spec.ggml_type)
        tensor_bytes += nbytes
        # GGUFWriter takes numpy order (reversed) and, for a non-uint8 dtype with raw_dtype,
        # the element shape as given.
        writer.add_tensor_info(
            spec.name, tuple(reversed(spec.dims)), np.dtype(np.float32), nbytes, spec.ggml_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()

    align = alignment or GGUF_DEFAULT_ALIGNMENT
    end_of_infos = os.path.getsize(path)
    header_bytes = _pad(end_of_infos, align) if specs else end_of_infos
    offsets: dict[str, int] = {}
    data_bytes = 0
    for spec in specs:
        offsets[spec.name] = data_bytes
        data_bytes += _pad(tensor_nbytes(spec.dims, spec.ggml_type), align)
    file_bytes = max(header_bytes + data_bytes, pad_to_bytes)
    # Extending with truncate leaves a hole: no data block is written.
    os.truncate(path, file_bytes)
    if tensor_data:
        with open(path, "r+b") as f:
            for name, data in tensor_data.items():
                spec = next(s for s in specs if s.name == name)
                if len(data) > tensor_nbytes(spec.dims, spec.ggml_type):
                    raise ValueError(f"data for {name} is larger than the tensor")
                f.seek(header_bytes + offsets[name])
                f.write(data)
    return WrittenGGUF(Path(path), header_bytes, tensor_bytes, file_bytes)


def llama_tensors(
    *,
    block_count: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    n_vocab: int,
    head_dim: int | None = None,
    ggml_type: GGMLQuantizationType = GGMLQuantizationType.F16,
) -> list[TensorSpec]:
    """The tensor infos of a llama-architecture model (names as llama.cpp's LLM_TENSOR_*).

    Args:
        block_count, n_embd, n_head, n_head_kv, n_ff, n_vocab: the geometry.
        head_dim: the head size (default n_embd / n_head).
        ggml_type: the type of every matrix; norms are F32, as converters write them.
    Returns:
        Token embedding, output norm and head, then per block the attention and FFN tensors.
    """
    hd = head_dim or n_embd // n_head
    f32 = GGMLQuantizationType.F32
    out = [
        TensorSpec("token_embd.weight", (n_embd, n_vocab), ggml_type),
        TensorSpec("output_norm.weight", (n_embd,), f32),
        TensorSpec("output.weight", (n_embd, n_vocab), ggml_type),
    ]
    for i in range(block_count):
        out += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,), f32),
            TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_head * hd), ggml_type),
            TensorSpec(f"blk.{i}.attn_k.weight", (n_embd, n_head_kv * hd), ggml_type),
            TensorSpec(f"blk.{i}.attn_v.weight", (n_embd, n_head_kv * hd), ggml_type),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_head * hd, n_embd), ggml_type),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,), f32),
            TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), ggml_type),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), ggml_type),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), ggml_type),
        ]
    return out


def tokenizer_kv(n_tokens: int, *, merges: int = 0) -> dict[str, object]:
    """A BPE ("gpt2") tokenizer's keys with `n_tokens` made-up tokens and `merges` merges.

    Args:
        n_tokens: the vocabulary size (at least 1).
        merges: how many merge rules to add (0: none).
    Returns:
        Keys for `write_gguf`'s `extra_kv`. The strings are 1-12 bytes like a real
        vocabulary's, so 150k tokens with as many merges make a header of ~7 MB, as real ones.
    """
    tokens = [_token(i) for i in range(n_tokens)]
    kv: dict[str, object] = {
        Keys.Tokenizer.MODEL: "gpt2",
        Keys.Tokenizer.PRE: "default",
        Keys.Tokenizer.LIST: tokens,
        Keys.Tokenizer.TOKEN_TYPE: Typed([1] * n_tokens, GGUFValueType.ARRAY, GGUFValueType.INT32),
        Keys.Tokenizer.BOS_ID: 0,
        Keys.Tokenizer.EOS_ID: min(1, n_tokens - 1),
    }
    if merges:
        kv[Keys.Tokenizer.MERGES] = [
            f"{_token(i % n_tokens)} {_token((i * 7 + 3) % n_tokens)}" for i in range(merges)
        ]
    return kv


def raw_prefix(*, version: int = 3, tensor_count: int = 0, kv_count: int = 0) -> bytes:
    """The first 24 bytes of a GGUF file (magic, version, counts), to build malformed files."""
    return struct.pack("<IIQQ", GGUF_MAGIC, version, tensor_count, kv_count)


def raw_string(text: str | bytes, *, declared_length: int | None = None) -> bytes:
    """A GGUF string (u64 length + bytes); `declared_length` lies about the length."""
    data = text.encode() if isinstance(text, str) else text
    n = len(data) if declared_length is None else declared_length
    return struct.pack("<Q", n) + data


def _token(i: int) -> str:
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    word = ""
    n = i
    while True:
        word += letters[n % 26]
        n //= 26
        if n == 0:
            break
    return ("Ġ" if i % 3 == 0 else "") + word * (1 + i % 3)


def _listify(value: int | Sequence[int]) -> int | list[int]:
    return value if isinstance(value, int) else list(value)


def _add(writer: GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, Typed):
        writer.add_key_value(key, value.value, value.vtype, sub_type=value.sub_type)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if 0 <= value < 2**32:
            writer.add_uint32(key, value)
        elif value >= 2**32:
            writer.add_uint64(key, value)
        elif value >= -(2**31):
            writer.add_int32(key, value)
        else:
            writer.add_int64(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise TypeError(f"cannot write {key}={value!r} to GGUF")


def _pad(n: int, align: int) -> int:
    return -(-n // align) * align
