"""llama.cpp's placement of layers on several devices (llmgw.engines.llamacpp.placement),
against its source's rule and the per-device buffers ground truth printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.engines.errors import EngineRefuses
from llmgw.engines.llamacpp.grammar import MIB
from llmgw.engines.llamacpp.placement import (
    CPU,
    layer_devices,
    placement,
    proportions_from_args,
    split_points,
)
from llmgw.shape import ModelShape
from planner_svc.domain.hf_shape import shape_from_hf_config

FIXTURES = Path(__file__).parent.parent / "fixtures"


def llama_70b() -> ModelShape:
    config = json.loads((FIXTURES / "hf" / "meta-llama__Llama-3.1-70B-Instruct.json").read_text())
    return shape_from_hf_config(config, weights_bytes=141_107_412_992)


def row(row_id: str) -> dict[str, object]:
    for line in (FIXTURES / "ground_truth" / "observations.jsonl").read_text().splitlines():
        data: dict[str, object] = json.loads(line)
        if data["id"] == row_id:
            return data
    raise AssertionError(row_id)


def test_gt002_kv_per_device_is_what_llama_cpp_printed() -> None:
    """gt-002: Llama-3.1-70B at -c 4096 -ngl 999 over two RPC devices of equal memory printed
    656 MiB of KV on the first and 624 on the second: 41 and 39 of its 80 layers."""
    printed = row("gt-002")["printed"]
    assert isinstance(printed, dict)
    args = ["-c", "4096", "-np", "1", "-ngl", "999"]
    devices = placement(llama_70b(), args, 2, compute_bytes=0)
    gpu0, gpu1, cpu = devices
    assert (gpu0.layers, gpu1.layers, gpu1.output, cpu.layers) == (41, 39, True, 0)
    assert gpu0.kv_bytes == printed["kv_rpc0_mib"] * MIB
    assert gpu1.kv_bytes == printed["kv_rpc1_mib"] * MIB
    assert cpu.weights_bytes > 0  # the token embeddings stay on the CPU


@pytest.mark.parametrize(
    ("n_layer", "gpu_layers", "proportions", "counts"),
    [
        (32, -1, [1, 1, 1], [11, 11, 11]),  # 33 with the output: 0-10, 11-21, 22-31 + output
        (80, -1, [1, 1], [41, 40]),
        (32, -1, [3, 1], [25, 8]),  # 3:1 of 33 layers: i / 33 < 0.75 for i <= 24
        (32, -1, [0, 1], [0, 33]),  # a device with share 0 gets nothing
        (32, 16, [1], [16]),  # offloading starts at 33 - 16 = 17
        (32, 0, [1], [0]),
        (4, -1, [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]),
    ],
)
def test_layers_go_to_the_first_device_whose_split_exceeds_their_fraction(
    n_layer: int, gpu_layers: int, proportions: list[float], counts: list[int]
) -> None:
    """Layer i (the output layer is i = n_layer) goes to the first device whose cumulative split
    exceeds (i - start) / offloaded; the rest stay on the CPU."""
    where = layer_devices(n_layer, gpu_layers, split_points(proportions))
    assert [where.count(d) for d in range(len(proportions))] == counts
    assert where.count(CPU) == n_layer + 1 - sum(counts)
    on_gpu = [d for d in where if d != CPU]
    assert on_gpu == sorted(on_gpu)  # consecutive runs, in device order
    if gpu_layers != 0:
        assert where[-1] == max(d for d, c in enumerate(counts) if c)  # output on the last


def test_split_points_are_float32_like_llama_cpp() -> None:
    """The boundary layer of a 1:1:1 split of 33 lands where float32 puts it: 11/33 equals
    the float32 1/3 split point, which is not greater, so layer 11 goes to the second device."""
    where = layer_devices(32, -1, split_points([1, 1, 1]))
    assert (where[10], where[11], where[21], where[22]) == (0, 1, 1, 2)


@pytest.mark.parametrize(
    ("args", "devices", "want"),
    [
        ([], 3, [1.0, 1.0, 1.0]),
        (["--tensor-split", "3,1"], 2, [3.0, 1.0]),
        (["-ts", "3/1"], 3, [3.0, 1.0, 0.0]),
        (["-ts", "0,0"], 2, [1.0, 1.0]),
        (
            ["-ts", "1,2,3"],
            2,
            [1.0, 2.0],
        ),  # entries past the devices are ignored  # all zero: llama.cpp splits by free memory
        (["--split-mode", "none", "--main-gpu", "1"], 3, [0.0, 1.0, 0.0]),
        (["-sm", "none"], 2, [1.0, 0.0]),
        # -mg indexes the node's GPUs: on a one-card replica the card holds everything.
        (["-sm", "none", "-mg", "1"], 1, [1.0]),
    ],
)
def test_the_split_is_read_from_the_args(args: list[str], devices: int, want: list[float]) -> None:
    """--tensor-split (, or / between entries), --split-mode none with --main-gpu."""
    assert proportions_from_args(args, devices) == want


@pytest.mark.parametrize("args", [["-ts", "a,b"], ["--tensor-split=-1,2"]])
def test_a_split_llama_cpp_refuses_is_refused(args: list[str]) -> None:
    """Non-numbers or negative shares."""
    with pytest.raises(EngineRefuses):
        split_points(proportions_from_args(args, 2))


def test_gt001_older_builds_started_offloading_one_layer_earlier() -> None:
    """gt-001 (LM Studio's llama.cpp of July 2025, 36 layers, -ngl 19) printed 9728 MiB of KV
    on CUDA0 and 8704 on the CPU at 512 MiB a layer: 19 layers offloaded and the output layer
    left on the CPU, the older rule (start = n_layer - ngl); the vendored build would offload
    18 layers and the output layer."""
    printed = row("gt-001")["printed"]
    assert isinstance(printed, dict)
    per_layer = printed["kv_total_mib"] / 36
    old = layer_devices(36, 19, split_points([1]), legacy_start=True)
    assert (old.count(0), old.count(CPU), old[-1]) == (19, 18, CPU)
    assert old[:36].count(0) * per_layer == printed["kv_cuda0_mib"]
    assert old[:36].count(CPU) * per_layer == printed["kv_cpu_mib"]
    new = layer_devices(36, 19, split_points([1]))
    assert (new[:36].count(0), new[-1]) == (18, 0)
