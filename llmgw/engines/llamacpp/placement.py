"""Where llama.cpp puts each layer when a model runs on several devices, and what each device
then holds (layers, weights, KV, compute buffers).

Restated from llama.cpp as vendored in llama-cpp-python 0.3.36 (nothing copied):
- src/llama-model.cpp:1555-1614 (`load_tensors`): the split is `--tensor-split` when any entry
  is non-zero, else each device's free memory; it is summed into cumulative split points, each
  divided by the total (all in float32). With n layers and `--n-gpu-layers` g (all: n + 1;
  src/llama-model.cpp:2002-2005), offloading starts at layer max(n + 1 - g, 0), min(g, n + 1)
  layers are offloaded (the output layer counting as layer n), and layer i goes to the first
  device whose split point exceeds (i - start) / offloaded, by `std::upper_bound`; layers before
  the start stay on the CPU. The input layer (token embeddings) is always on the CPU.
- src/llama.cpp:289-300: `--split-mode none` keeps only `--main-gpu` (every offloaded layer
  there).
- common/arg.cpp:2831-2856: `--tensor-split` is proportions separated by "," or "/".
- src/llama-kv-cache.cpp:212-219: each layer's cache is on its layer's device.
ground truth gt-002 (Llama-3.1-70B, 80 layers over two RPC devices of equal memory) printed
41 layers' KV (656 MiB) on the first and 39 (624 MiB) on the second: this rule's answer.
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_right
from collections.abc import Sequence
from functools import lru_cache

from llmgw.engines.base import DevicePlacement
from llmgw.engines.errors import EngineRefuses
from llmgw.engines.llamacpp.cache import LlamaCppCache, llamacpp_layer_bytes
from llmgw.engines.llamacpp.grammar import (
    GRAMMAR,
    SPLIT_MODE,
    TENSOR_SPLIT,
    LlamaCppSettings,
    refuse,
    settings_from_args,
)
from llmgw.shape import ModelShape

MAIN_GPU = ("--main-gpu", "-mg")
CPU = -1
"""The device index `layer_devices` gives a layer left on the CPU."""


def _f32(x: float) -> float:
    """`x` rounded to float32, as llama.cpp's split arithmetic is."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def split_points(proportions: Sequence[float]) -> list[float]:
    """The cumulative split points llama.cpp derives from per-device proportions (float32).

    Raises:
        EngineRefuses: no device, or proportions that are negative or sum to 0.
    """
    if not proportions or any(p < 0 for p in proportions) or not any(proportions):
        refuse("--tensor-split needs non-negative proportions, not all 0")
    total = 0.0
    sums = []
    for p in proportions:
        total = _f32(total + _f32(p))
        sums.append(total)
    return [_f32(s / total) for s in sums]


def layer_devices(
    n_layer: int, gpu_layers: int, points: Sequence[float], *, legacy_start: bool = False
) -> list[int]:
    """The device of each layer 0..n_layer - 1 and, last, of the output layer (`CPU` for
    those left on the CPU).

    Args:
        n_layer: the model's repeating layers.
        gpu_layers: `--n-gpu-layers` (a negative value: all).
        points: the split points (`split_points`), one per device.
        legacy_start: the rule of older llama.cpp builds (2025 and before, e.g. ground truth
            gt-001), which started offloading at n_layer - g, so that -ngl counted repeating
            layers first and the output layer only past them; the vendored build starts at
            n_layer + 1 - g.
    """
    return list(_layer_devices(n_layer, gpu_layers, tuple(points), legacy_start))


@lru_cache(maxsize=1024)
def _layer_devices(
    n_layer: int, gpu_layers: int, points: tuple[float, ...], legacy_start: bool
) -> tuple[int, ...]:
    """`layer_devices`, remembered: a search over contexts places the same layers each time."""
    g = n_layer + 1 if gpu_layers < 0 else gpu_layers
    start = max(n_layer - g if legacy_start else n_layer + 1 - g, 0)
    offloaded = min(g, n_layer + 1) if points else 0
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= offloaded:
            out.append(CPU)
            continue
        value = _f32(_f32(float(il - start)) / _f32(float(offloaded)))
        out.append(min(bisect_right(points, value), len(points) - 1))
    return tuple(out)


def proportions_from_args(args: Sequence[str], devices: int) -> list[float]:
    """Each device's share: `--tensor-split` (missing entries 0), equal without one (llama.cpp
    splits by free memory, equal on identical idle cards), or all on `--main-gpu` with
    `--split-mode none`.

    Raises:
        EngineRefuses: a split that is not numbers.
    """
    mode = (GRAMMAR.get(args, SPLIT_MODE) or "layer").strip().lower()
    if mode == "none":
        # --main-gpu indexes the node's devices, which may be more than the replica's cards
        # (-mg 1 on a one-card replica picks the node's second GPU): one card holds it all.
        main = GRAMMAR.get_int(args, MAIN_GPU, 0)
        main = main if 0 <= main < devices else 0
        return [1.0 if i == main else 0.0 for i in range(devices)]
    raw = GRAMMAR.get(args, TENSOR_SPLIT)
    if raw is None:
        return [1.0] * devices
    try:
        values = [float(v) for v in re.split(r"[,/]+", raw.strip()) if v != ""]
    except ValueError:
        refuse(f"--tensor-split {raw!r} is not a list of numbers")
    # load_tensors copies the first n_devices() entries: extra ones are ignored.
    values = values[:devices] + [0.0] * (devices - len(values))
    if not any(values):
        return [1.0] * devices
    return values


def placement(
    shape: ModelShape,
    args: Sequence[str],
    devices: int,
    *,
    compute_bytes: int,
    settings: LlamaCppSettings | None = None,
    cache: LlamaCppCache | None = None,
) -> tuple[DevicePlacement, ...]:
    """What llama.cpp puts on each of `devices` cards for `shape` run with `args` (already set
    for the context and slots), then on the CPU if anything stays there.

    Weights per device are exact when the shape carries its GGUF's tensor table
    (`weights_per_device`), else estimated as weights / (n_layer + 2) a layer (the token
    embeddings, on the CPU, and the output layer each about a layer). KV is exact
    (`llamacpp_layer_bytes`); `compute_bytes` (the per-card compute buffer estimate) is put on
    every card that holds a layer. `settings` and `cache` are
    `settings_from_args(args)` and its `llamacpp_cache`, when the caller has them.

    Raises:
        EngineRefuses: settings llama.cpp refuses.
    """
    if settings is None:
        settings = settings_from_args(args)
    n = shape.block_count
    points = split_points(proportions_from_args(args, max(devices, 1)))
    gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else -1
    where = _layer_devices(n, gpu_layers, tuple(points), False)
    kv = llamacpp_layer_bytes(shape, settings, cache)
    count = max(devices, 1)
    weights_on = weights_per_device(shape, where, count)
    # One pass over the layers: (layers, first, last, KV) per device, the CPU last.
    held = [[0, 0, 0, 0] for _ in range(count + 1)]
    for il in range(n):
        slot = held[where[il]]  # CPU (-1) is the last entry
        if slot[0] == 0:
            slot[1] = il
        slot[0] += 1
        slot[2] = il
        slot[3] += kv[il]
    out: list[DevicePlacement] = []
    for device in [*range(count), CPU]:
        layers, first, last, kv_bytes = held[device]
        output = where[n] == device
        weights = weights_on[device]
        out.append(
            DevicePlacement(
                device="CPU" if device == CPU else f"GPU{device}",
                layers=layers,
                first_layer=first,
                last_layer=last,
                output=output,
                weights_bytes=weights,
                kv_bytes=kv_bytes,
                compute_bytes=compute_bytes if (layers or output) and device != CPU else 0,
            )
        )
    return tuple(out)


def weights_per_device(shape: ModelShape, where: Sequence[int], devices: int) -> list[int]:
    """The weights each of `devices` devices holds, the CPU last, for layers placed as `where`
    (`layer_devices`: one entry per layer, then the output layer).

    With the GGUF's tensor table (`ModelShape.weights_layout`) a device holds its layers'
    `blk.N.*` tensors, a copy of the per-layer tensors (rope_freqs) for each of them, and the
    output layer's tensors if it has the output layer; the CPU also holds the input layer
    (token embeddings). That is llama.cpp's "model buffer size" per device
    (src/llama-model.cpp load_tensors: each tensor in its layer's buffer type), before each
    backend's padding of a tensor (at most its alignment, plus one row to 512 elements for
    quantized rows not already a multiple on CUDA). A tied head on the CPU is the embeddings'
    mapped bytes, not a second copy. Without the table: weights / (n_layer + 2) a layer, the
    CPU holding what is left.
    """
    n = shape.block_count
    out = [0] * (devices + 1)  # CPU (-1) is the last entry
    layout = shape.weights_layout
    if layout is None or len(layout.layer_bytes) != n:
        per_layer = shape.weights_bytes // (n + 2) if n else 0
        for device in where:
            if device != CPU:
                out[device] += per_layer
        out[CPU] = shape.weights_bytes - sum(out[:devices])
        return out
    for il in range(n):
        out[where[il]] += layout.layer_bytes[il] + layout.per_layer_copy_bytes
    out[CPU] += layout.input_bytes
    out[where[n]] += layout.output_bytes + (layout.head_copy_bytes if where[n] != CPU else 0)
    return out


__all__ = [
    "CPU",
    "EngineRefuses",
    "layer_devices",
    "placement",
    "proportions_from_args",
    "split_points",
    "weights_per_device",
]
