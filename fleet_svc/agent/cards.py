"""The node's cards: found through NVML, or told (a spec like `8xH100-80GB` or a YAML file)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from fleet_svc.agent import claims
from llmgw.card import Card
from llmgw.cardclass import KNOWN_CARDS, class_memory_bytes

MIB = 1 << 20
GIB = 1 << 30

_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?([A-Za-z0-9][A-Za-z0-9_.\-]*)\s*$")
# A node has at most this many cards; a spec past it is a typo, not a machine.
MAX_CARDS = 64


class CardSpecError(ValueError):
    """A card spec or card file that cannot be read; the message says what would work."""


def card_class_cuda_bytes(model: str) -> int:
    """The CUDA total an engine log printed for a card of class `model` (llmgw/cardclass.py
    KNOWN_CARDS, each figure cited there); 0 when no log gives one (the planner then derives
    it from NVML's, with its margin)."""
    known = KNOWN_CARDS.get(model.strip().lower())
    return known.cuda_mib * MIB if known is not None else 0


def card_class_bytes(model: str) -> int:
    """Memory of a card of class `model`: a known card's NVML total, else the "NNGB" in the
    name read as GiB (the table is shared with the planner: llmgw/cardclass.py).

    Raises:
        CardSpecError: the class is unknown and names no memory size.
    """
    size = class_memory_bytes(model)
    if size <= 0:
        raise CardSpecError(
            f"card class {model!r} names no memory size: write it like H100-80GB or L4-24GB"
        )
    return size


def _standin_uuid(index: int, model: str) -> str:
    # Stable across agent restarts, so the fleet sees the same card each time.
    return f"GPU-standin-{index:02d}-{model.lower()}"


def parse_gpu_spec(spec: str) -> list[Card]:
    """Cards from a spec such as `8xH100-80GB`, `2xL4-24GB,1xA100-80GB` or `none`.

    A part without a count is one card. Indices count from 0 across the parts in order.

    Raises:
        CardSpecError: a part is malformed, a count is 0 or the total is past `MAX_CARDS`.
    """
    text = spec.strip()
    if text.lower() in ("", "none", "cpu", "0"):
        return []
    cards: list[Card] = []
    for part in text.split(","):
        match = _SPEC_PART.fullmatch(part)
        if match is None:
            raise CardSpecError(
                f"card spec part {part.strip()!r} is not COUNTxCLASS, e.g. 8xH100-80GB"
            )
        count = int(match.group(1) or "1")
        model = match.group(2)
        if count < 1:
            raise CardSpecError(f"card spec part {part.strip()!r} has no cards; leave it out")
        if len(cards) + count > MAX_CARDS:
            raise CardSpecError(f"card spec {spec!r} names more than {MAX_CARDS} cards")
        memory = card_class_bytes(model)
        cuda = card_class_cuda_bytes(model)
        for _ in range(count):
            index = len(cards)
            cards.append(Card(index, _standin_uuid(index, model), model, memory, 0, cuda))
    return cards


def parse_gpus_file(data: Any, where: str = "the cards file") -> list[Card]:
    """Cards from the parsed YAML of a cards file.

    The file holds `cards:`, a list of entries `{model, count?, memory_total_bytes?,
    cuda_memory_total_bytes?, uuid?}` (count defaults to 1; memory to the class's NVML total;
    the CUDA total to the class's logged one, else 0 when memory is given or none is logged;
    uuid to a stable stand-in one).

    Raises:
        CardSpecError: the data does not have that shape.
    """
    entries = data.get("cards") if isinstance(data, dict) else data
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise CardSpecError(f"{where}: `cards` must be a list of {{model, count}} entries")
    cards: list[Card] = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            raise CardSpecError(f"{where}: card entry {n} needs a `model` such as H100-80GB")
        model = entry["model"]
        count = entry.get("count", 1)
        memory = entry.get("memory_total_bytes")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise CardSpecError(f"{where}: card entry {n} `count` must be a whole number >= 1")
        cuda = entry.get("cuda_memory_total_bytes")
        if memory is None:
            memory = card_class_bytes(model)
            cuda = card_class_cuda_bytes(model) if cuda is None else cuda
        elif not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0:
            raise CardSpecError(f"{where}: card entry {n} `memory_total_bytes` must be > 0")
        if cuda is None:
            cuda = 0  # a told NVML total of a card no log gives: the planner derives CUDA's
        elif not isinstance(cuda, int) or isinstance(cuda, bool) or not 0 < cuda <= memory:
            raise CardSpecError(
                f"{where}: card entry {n} `cuda_memory_total_bytes` must be > 0 and at most "
                "its memory_total_bytes (CUDA reports less than NVML)"
            )
        uuid = entry.get("uuid")
        if uuid is not None and (not isinstance(uuid, str) or count != 1):
            raise CardSpecError(f"{where}: card entry {n} `uuid` is a string, on one card only")
        if len(cards) + count > MAX_CARDS:
            raise CardSpecError(f"{where} names more than {MAX_CARDS} cards")
        for _ in range(count):
            index = len(cards)
            cards.append(Card(index, uuid or _standin_uuid(index, model), model, memory, 0, cuda))
    return cards


def load_gpus_file(path: Path) -> list[Card]:
    """Cards from a YAML cards file (see `parse_gpus_file`).

    Raises:
        CardSpecError: the file cannot be read or does not have the expected shape.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CardSpecError(f"cannot read the cards file {path}: {exc}") from exc
    return parse_gpus_file(data, str(path))


class CardBackend(Protocol):
    """Where the agent reads its cards and their memory use."""

    kind: str
    """"nvml" for real cards, "standin" for told ones, "none" for a CPU node."""

    def read(self) -> list[Card]:
        """The cards now, with their memory in use."""
        ...

    def env_for(self, indices: Sequence[int]) -> dict[str, str]:
        """Environment a process running on these cards needs beyond CUDA_VISIBLE_DEVICES."""
        ...

    def release(self, pid: int) -> None:
        """Forget what process `pid` held (it is gone)."""
        ...


class NoCards:
    """A CPU node: no cards."""

    kind = "none"

    def read(self) -> list[Card]:
        """No cards."""
        return []

    def env_for(self, indices: Sequence[int]) -> dict[str, str]:
        """Nothing to add."""
        return {}

    def release(self, pid: int) -> None:
        """Nothing held."""


class StandinCards:
    """Told cards whose memory use is the sum of live processes' claim files (see `claims`)."""

    kind = "standin"

    def __init__(self, cards: Sequence[Card], state_dir: Path) -> None:
        self._cards = list(cards)
        self.cards_dir = state_dir / "cards"
        self.cards_dir.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[Card]:
        """The told cards, each with the sum of its live claims as memory in use."""
        return [
            replace(c, memory_used_bytes=claims.used_bytes(self.cards_dir, c.index))
            for c in self._cards
        ]

    def env_for(self, indices: Sequence[int]) -> dict[str, str]:
        """Tells a stand-in engine where to write its claims."""
        return {claims.CARDS_DIR_ENV: str(self.cards_dir)}

    def release(self, pid: int) -> None:
        """Remove the claims of a process that is gone."""
        claims.release(self.cards_dir, pid)


class NvmlCards:
    """Real cards read through NVML (the `pynvml` module of the nvidia-ml-py package), with
    each card's CUDA total by its UUID (`cuda_totals`, read once: it does not change)."""

    kind = "nvml"

    def __init__(self, nvml: Any, cuda_totals_by_uuid: dict[str, int] | None = None) -> None:
        self._nvml = nvml
        self._cuda = cuda_totals_by_uuid or {}

    def read(self) -> list[Card]:
        """Every device NVML lists, with its memory total and use. A device whose memory NVML
        does not report (a unified-memory GB10 raises NVMLError_NotSupported) is given CUDA's
        total for both totals and no use: the card is still listed, and sized by what CUDA
        gives the engines."""
        nvml = self._nvml
        cards = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            cuda = self._cuda.get(uuid.lower(), 0)
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                total, used = int(memory.total), int(memory.used)
            except Exception:  # pynvml's NVMLError subclasses: this query is not supported
                total, used = cuda, 0
            cards.append(
                Card(
                    index=index,
                    uuid=uuid,
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=total,
                    memory_used_bytes=used,
                    cuda_memory_total_bytes=cuda,
                )
            )
        return cards

    def env_for(self, indices: Sequence[int]) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES is enough for real cards."""
        return {}

    def release(self, pid: int) -> None:
        """The driver frees a dead process's memory by itself."""


def _text(value: Any) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml(import_module: Callable[[str], Any] = importlib.import_module) -> NvmlCards | None:
    """NVML's cards when nvidia-ml-py is installed, a driver loads and it lists a device;
    None otherwise (no package, no driver, no devices: a CPU node or a test machine)."""
    try:
        nvml = import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
        if nvml.nvmlDeviceGetCount() < 1:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            return None
    except Exception:  # pynvml raises NVMLError subclasses for a missing driver or library
        return None
    return NvmlCards(nvml, cuda_totals(load_libcuda()))


def load_libcuda() -> Any:
    """The CUDA driver library (libcuda.so.1), None when it does not load."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def cuda_totals(lib: Any) -> dict[str, int]:
    """Each CUDA device's total memory by its UUID as NVML writes it ("gpu-…", lower case),
    from the CUDA driver: cuInit, then per device cuDeviceTotalMem_v2 and cuDeviceGetUuid.

    cuDeviceTotalMem is the figure torch's total_memory and cudaMemGetInfo's total report
    (H100 80GB: 79.19 GiB where NVML says 81,559 MiB); it needs no CUDA context, so nothing is
    allocated on the cards. Devices are matched to NVML's by UUID, since CUDA may number them
    in another order (CUDA_DEVICE_ORDER). Empty when `lib` is None or any call fails.
    """
    if lib is None:
        return {}
    try:
        if lib.cuInit(0) != 0:
            return {}
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return {}
        totals: dict[str, int] = {}
        for ordinal in range(min(count.value, MAX_CARDS)):
            device = ctypes.c_int(0)
            total = ctypes.c_size_t(0)
            raw = (ctypes.c_ubyte * 16)()
            if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                continue
            if lib.cuDeviceTotalMem_v2(ctypes.byref(total), device) != 0:
                continue
            if lib.cuDeviceGetUuid(raw, device) != 0:
                continue
            totals[_nvml_uuid(bytes(raw))] = int(total.value)
        return totals
    except (AttributeError, OSError, ctypes.ArgumentError):
        return {}


def _nvml_uuid(raw: bytes) -> str:
    """A CUDA device UUID's 16 bytes as NVML writes them: gpu-8-4-4-4-12 hex digits."""
    h = raw.hex()
    return f"gpu-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def discover_cards(
    spec: str | None,
    gpus_file: Path | None,
    state_dir: Path,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> CardBackend:
    """The node's cards: told ones when a spec or file is given (the operator's word wins),
    else NVML's, else none.

    Raises:
        CardSpecError: the spec or file cannot be read.
    """
    if spec is not None and gpus_file is not None:
        raise CardSpecError("give the cards as --gpus or --gpus-file, not both")
    if gpus_file is not None:
        return StandinCards(load_gpus_file(gpus_file), state_dir)
    if spec is not None:
        told = parse_gpu_spec(spec)
        return StandinCards(told, state_dir) if told else NoCards()
    return open_nvml(import_module) or NoCards()
