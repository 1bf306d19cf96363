"""Malformed and hostile GGUF headers, as raw bytes: each a way a file can be wrong, and the
words of the refusal it must get. The parser's unit tests read them from memory, the
transport's integration tests from disk and over HTTP."""

from __future__ import annotations

import struct

from gguf import GGUFValueType

from tests.support.gguf_files import raw_prefix, raw_string


def raw_kv(key: str, vtype: GGUFValueType, payload: bytes) -> bytes:
    """One raw KV pair."""
    return raw_string(key) + struct.pack("<I", vtype) + payload


ARCH_KV = raw_kv("general.architecture", GGUFValueType.STRING, raw_string("llama"))
U32 = GGUFValueType.UINT32


def raw_tensor_info(name: str, dims: list[int], ggml_type: int, offset: int = 0) -> bytes:
    """One raw tensor info."""
    packed_dims = b"".join(struct.pack("<Q", d) for d in dims)
    return (
        raw_string(name)
        + struct.pack("<I", len(dims))
        + packed_dims
        + struct.pack("<IQ", ggml_type, offset)
    )


HOSTILE_HEADERS: list[tuple[str, bytes, str]] = [
    ("empty", b"", "truncated"),
    ("garbage", bytes(range(256)) * 64, "not a GGUF file"),
    ("bad-magic", b"GGML" + bytes(60), "not a GGUF file"),
    ("html", b"<!DOCTYPE html><html>" + bytes(100), "web page"),
    ("version-1", raw_prefix(version=1), "v1"),
    ("version-4", raw_prefix(version=4), "version 4"),
    ("big-endian", raw_prefix(version=3 << 24), "big-endian"),
    ("key-length-2^60", raw_prefix(kv_count=1) + struct.pack("<Q", 2**60), "string of"),
    (
        "value-length-2^60",
        raw_prefix(kv_count=1)
        + raw_kv("general.name", GGUFValueType.STRING, struct.pack("<Q", 2**60)),
        "string of",
    ),
    (
        "array-count-2^62",
        raw_prefix(kv_count=1)
        + raw_kv(
            "llama.attention.head_count_kv", GGUFValueType.ARRAY, struct.pack("<IQ", U32, 2**62)
        ),
        "items in",
    ),
    (
        "string-array-count-2^61",
        raw_prefix(kv_count=1)
        + raw_kv(
            "tokenizer.ggml.tokens",
            GGUFValueType.ARRAY,
            struct.pack("<IQ", GGUFValueType.STRING, 2**61),
        ),
        "strings in",
    ),
    ("tensor-count-2^40", raw_prefix(tensor_count=2**40), "tensors"),
    # Within every bound, but the file ends long before 2^19 tensor infos.
    ("tensor-count-past-eof", raw_prefix(tensor_count=2**19), "truncated"),
    ("kv-count-2^40", raw_prefix(kv_count=2**40), "key/value pairs"),
    (
        "unknown-value-type",
        raw_prefix(kv_count=1) + raw_string("general.x") + struct.pack("<I", 99),
        "unknown type 99",
    ),
    (
        "nested-array",
        raw_prefix(kv_count=1)
        + raw_kv("general.x", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.ARRAY, 1)),
        "nests arrays",
    ),
    ("duplicate-key", raw_prefix(kv_count=2) + ARCH_KV + ARCH_KV, "repeats key"),
    (
        "alignment-not-power-of-2",
        raw_prefix(kv_count=1) + raw_kv("general.alignment", U32, struct.pack("<I", 48)),
        "power of two",
    ),
    (
        "alignment-wrong-type",
        raw_prefix(kv_count=1)
        + raw_kv("general.alignment", GGUFValueType.UINT64, struct.pack("<Q", 32)),
        "not UINT32",
    ),
    (
        "five-dimensions",
        raw_prefix(tensor_count=1, kv_count=1) + ARCH_KV + raw_tensor_info("t", [1] * 5, 0),
        "5 dimensions",
    ),
    (
        "unknown-tensor-type",
        raw_prefix(tensor_count=1, kv_count=1) + ARCH_KV + raw_tensor_info("t", [32], 77),
        "ggml type 77",
    ),
    (
        "row-not-whole-blocks",
        raw_prefix(tensor_count=1, kv_count=1) + ARCH_KV + raw_tensor_info("t", [33], 8),
        "not a multiple",
    ),
    (
        "overflowing-shape",
        raw_prefix(tensor_count=1, kv_count=1) + ARCH_KV + raw_tensor_info("t", [2**62, 2**62], 0),
        "impossible shape",
    ),
    (
        "gapped-offsets",
        raw_prefix(tensor_count=2, kv_count=1)
        + ARCH_KV
        + raw_tensor_info("a", [32], 0, 0)
        + raw_tensor_info("b", [32], 0, 4096),
        "starts at data offset",
    ),
]
