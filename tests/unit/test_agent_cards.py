"""The node's cards: specs, card files, NVML (through a fake module) and memory claims."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_svc.agent import claims
from fleet_svc.agent.cards import (
    GIB,
    MIB,
    CardSpecError,
    NoCards,
    NvmlCards,
    StandinCards,
    card_class_bytes,
    cuda_totals,
    discover_cards,
    parse_gpu_spec,
    parse_gpus_file,
)
from llmgw.card import Card


@pytest.mark.parametrize(
    ("spec", "models", "memory_bytes"),
    [
        ("8xH100-80GB", ["H100-80GB"] * 8, 81559 * MIB),
        ("1xA100-80GB", ["A100-80GB"], 81920 * MIB),
        ("2xL4-24GB", ["L4-24GB"] * 2, 23034 * MIB),
        ("L4-24GB", ["L4-24GB"], 23034 * MIB),
        ("2 x RTX6000-48GB", ["RTX6000-48GB"] * 2, 48 * GIB),
        ("4xMI300X-192GB", ["MI300X-192GB"] * 4, 192 * GIB),
        ("none", [], 0),
        ("", [], 0),
    ],
)
def test_gpu_spec_gives_count_times_class_with_nvml_memory(
    spec: str, models: list[str], memory_bytes: int
) -> None:
    """COUNTxCLASS gives that many cards, indexed from 0, with the class's NVML total or the
    NNGB of its name as GiB."""
    cards = parse_gpu_spec(spec)
    assert [c.model for c in cards] == models
    assert [c.index for c in cards] == list(range(len(models)))
    assert all(c.memory_total_bytes == memory_bytes for c in cards)
    assert len({c.uuid for c in cards}) == len(cards)


def test_mixed_spec_indexes_across_parts() -> None:
    """Parts separated by commas follow each other in index order."""
    cards = parse_gpu_spec("2xL4-24GB,1xH100-80GB")
    assert [(c.index, c.model) for c in cards] == [(0, "L4-24GB"), (1, "L4-24GB"), (2, "H100-80GB")]


@pytest.mark.parametrize("spec", ["0xH100-80GB", "8xMYSTERY", "x;rm", "65xL4-24GB", "8x"])
def test_bad_gpu_specs_are_refused(spec: str) -> None:
    """No cards, a class without a memory size, junk and more than 64 cards are refused."""
    with pytest.raises(CardSpecError):
        parse_gpu_spec(spec)


def test_unknown_class_without_size_says_how_to_write_it() -> None:
    """The refusal of a class with no memory size shows the form that works."""
    with pytest.raises(CardSpecError, match="H100-80GB"):
        card_class_bytes("Mystery")


def test_gpus_file_lists_cards_with_counts_and_overrides() -> None:
    """A cards file gives counts, memory overrides and fixed UUIDs."""
    data = yaml.safe_load(
        """
        cards:
          - {model: H100-80GB, count: 2}
          - {model: Custom, memory_total_bytes: 1000, uuid: GPU-abc}
        """
    )
    cards = parse_gpus_file(data)
    assert [(c.index, c.model, c.memory_total_bytes) for c in cards] == [
        (0, "H100-80GB", 81559 * MIB),
        (1, "H100-80GB", 81559 * MIB),
        (2, "Custom", 1000),
    ]
    assert cards[2].uuid == "GPU-abc"


@pytest.mark.parametrize(
    "data",
    [
        {"cards": "H100"},
        {"cards": [{"count": 2}]},
        {"cards": [{"model": "H100-80GB", "count": 0}]},
        {"cards": [{"model": "H100-80GB", "count": True}]},
        {"cards": [{"model": "X", "memory_total_bytes": -1}]},
        {"cards": [{"model": "H100-80GB", "count": 2, "uuid": "GPU-1"}]},
    ],
)
def test_malformed_gpus_files_are_refused(data: Any) -> None:
    """A cards file of the wrong shape is refused with what would work."""
    with pytest.raises(CardSpecError):
        parse_gpus_file(data)


@dataclass
class _Memory:
    total: int
    used: int


class FakeNvml:
    """The few pynvml calls the agent makes, over a list of (name, total, used)."""

    def __init__(self, devices: list[tuple[str, int, int]], init_error: bool = False) -> None:
        self.devices = devices
        self.init_error = init_error
        self.uuids: list[str] = []

    def nvmlInit(self) -> None:
        if self.init_error:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.devices[handle][0].encode()  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle] if self.uuids else f"GPU-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        _, total, used = self.devices[handle]
        return _Memory(total, used)


def importer(module: Any) -> Any:
    """An import function that yields `module` for pynvml, or raises ImportError for None."""

    def load(name: str) -> Any:
        assert name == "pynvml"
        if module is None:
            raise ImportError("No module named 'pynvml'")
        return module

    return load


def test_nvml_cards_are_read_when_a_driver_lists_devices(tmp_path: Path) -> None:
    """With NVML and devices, the cards are NVML's, names decoded, memory as reported."""
    nvml = FakeNvml([("NVIDIA H100 80GB HBM3", 81559 * MIB, 5 * MIB)])
    backend = discover_cards(None, None, tmp_path, importer(nvml))
    assert isinstance(backend, NvmlCards)
    assert backend.read() == [Card(0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559 * MIB, 5 * MIB)]


@pytest.mark.parametrize(
    "module",
    [None, FakeNvml([], init_error=True), FakeNvml([])],
    ids=["absent", "nodriver", "none"],
)
def test_no_nvml_package_driver_or_device_means_no_cards(module: Any, tmp_path: Path) -> None:
    """Without nvidia-ml-py, a driver or a device, the node has no cards."""
    assert isinstance(discover_cards(None, None, tmp_path, importer(module)), NoCards)


def test_told_cards_win_over_nvml(tmp_path: Path) -> None:
    """A --gpus spec is used even where NVML lists devices: the operator's word wins."""
    nvml = FakeNvml([("NVIDIA L4", 23034 * MIB, 0)])
    backend = discover_cards("2xH100-80GB", None, tmp_path, importer(nvml))
    assert isinstance(backend, StandinCards) and len(backend.read()) == 2


def test_standin_cards_count_live_claims_only(tmp_path: Path) -> None:
    """A card's use is the sum of its live processes' claims; a dead process's claim stops
    counting and is removed."""
    backend = StandinCards(parse_gpu_spec("2xL4-24GB"), tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(dead.stdout)
    claims.claim(backend.cards_dir, 0, os.getpid(), 300)
    claims.claim(backend.cards_dir, 0, dead_pid, 1000)
    claims.claim(backend.cards_dir, 1, os.getpid(), 7)
    assert [c.memory_used_bytes for c in backend.read()] == [300, 7]
    assert claims.claimed_by(backend.cards_dir, dead_pid) == []
    backend.release(os.getpid())
    assert [c.memory_used_bytes for c in backend.read()] == [0, 0]


def test_unreadable_claims_are_dropped(tmp_path: Path) -> None:
    """A claim file that is not a claim counts for nothing and is removed."""
    folder = tmp_path / "0"
    folder.mkdir()
    (folder / "123.json").write_text("{not json")
    assert claims.used_bytes(tmp_path, 0) == 0
    assert not (folder / "123.json").exists()


@pytest.mark.parametrize(
    ("spec", "cuda_bytes"),
    [
        ("2xH100-80GB", 81090 * MIB),
        ("A100-80GB", 81152 * MIB),
        ("L4-24GB", 22579 * MIB),
        ("RTX4090-24GB", 0),
    ],
)
def test_standin_cards_report_the_logged_cuda_total(spec: str, cuda_bytes: int) -> None:
    """A stand-in card of a class an engine log gives a CUDA total for reports it; one no log
    covers reports none (the planner derives it, with its margin)."""
    assert {c.cuda_memory_total_bytes for c in parse_gpu_spec(spec)} == {cuda_bytes}


def test_cards_file_takes_a_cuda_total_and_refuses_one_above_nvml() -> None:
    """A cards file may give the CUDA total; one above the NVML total is refused, and a told
    NVML total without it leaves CUDA's unknown."""
    (told,) = parse_gpus_file(
        {
            "cards": [
                {
                    "model": "X-80GB",
                    "memory_total_bytes": 80 * GIB,
                    "cuda_memory_total_bytes": 79 * GIB,
                }
            ]
        }
    )
    assert told.cuda_memory_total_bytes == 79 * GIB
    (bare,) = parse_gpus_file({"cards": [{"model": "H100-80GB", "memory_total_bytes": 80 * GIB}]})
    assert bare.cuda_memory_total_bytes == 0
    (known,) = parse_gpus_file({"cards": [{"model": "H100-80GB"}]})
    assert known.cuda_memory_total_bytes == 81090 * MIB
    with pytest.raises(CardSpecError, match="at most its memory_total_bytes"):
        parse_gpus_file(
            {
                "cards": [
                    {"model": "X", "memory_total_bytes": GIB, "cuda_memory_total_bytes": 2 * GIB}
                ]
            }
        )


class FakeLibcuda:
    """The CUDA driver calls `cuda_totals` makes, over (uuid bytes, total) per ordinal; the
    out-parameters are written through ctypes' byref objects as the real library would."""

    def __init__(self, devices: list[tuple[bytes, int]], init_result: int = 0) -> None:
        self.devices = devices
        self.init_result = init_result

    def cuInit(self, flags: int) -> int:
        return self.init_result

    def cuDeviceGetCount(self, count: Any) -> int:
        count._obj.value = len(self.devices)
        return 0

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        device._obj.value = ordinal
        return 0

    def cuDeviceTotalMem_v2(self, total: Any, device: ctypes.c_int) -> int:
        total._obj.value = self.devices[device.value][1]
        return 0

    def cuDeviceGetUuid(self, raw: Any, device: ctypes.c_int) -> int:
        raw[:] = list(self.devices[device.value][0])
        return 0


def test_nvml_cards_carry_cuda_totals_matched_by_uuid() -> None:
    """CUDA's totals are matched to NVML's cards by UUID, whatever order CUDA numbers them in;
    a failing driver gives none."""
    first, second = bytes(range(16)), bytes(range(16, 32))
    lib = FakeLibcuda([(second, 23000 * MIB), (first, 81090 * MIB)])  # CUDA's order differs
    totals = cuda_totals(lib)
    uuid = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert totals[uuid.lower()] == 81090 * MIB
    nvml = FakeNvml([("NVIDIA H100 80GB HBM3", 81559 * MIB, 0)])
    nvml.uuids = [uuid]
    (card,) = NvmlCards(nvml, totals).read()
    assert card.cuda_memory_total_bytes == 81090 * MIB
    assert card.memory_total_bytes == 81559 * MIB
    assert cuda_totals(FakeLibcuda([(first, 1)], init_result=100)) == {}
    assert cuda_totals(None) == {}


class NotSupported(Exception):
    """What pynvml raises for a query the device does not answer (NVMLError_NotSupported)."""


def test_a_card_whose_memory_nvml_does_not_report_is_listed_with_cudas_total() -> None:
    """On a unified-memory GB10 NVML's memory query raises NotSupported: the card is still
    listed, with CUDA's total as both totals and no use, beside a card NVML answers for."""
    gb10 = bytes(range(16))
    uuid = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    nvml = FakeNvml([("NVIDIA GB10", 0, 0), ("NVIDIA H100 80GB HBM3", 81559 * MIB, 7 * MIB)])
    nvml.uuids = [uuid, "GPU-1"]
    answered = nvml.nvmlDeviceGetMemoryInfo

    def memory_info(handle: int) -> _Memory:
        if handle == 0:
            raise NotSupported("Not Supported")
        return answered(handle)

    nvml.nvmlDeviceGetMemoryInfo = memory_info  # type: ignore[method-assign]
    totals = cuda_totals(FakeLibcuda([(gb10, 122572 * MIB)]))
    spark, h100 = NvmlCards(nvml, totals).read()
    assert spark == Card(0, uuid, "NVIDIA GB10", 122572 * MIB, 0, 122572 * MIB)
    assert (h100.memory_total_bytes, h100.memory_used_bytes) == (81559 * MIB, 7 * MIB)
