"""Typed, range-checked access to a GGUF header's keys, each failure an InvalidShape naming
the key: what every rule of gguf_shape.py reads the header through."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

from gguf import Keys

from planner_svc.domain.errors import InvalidShape

# src/llama-hparams.h: LLAMA_MAX_LAYERS; llama.cpp refuses a block_count above it.
MAX_LAYERS = 512
# Generous ceilings for "absurd": far past any released model, far below overflow.
MAX_HEADS = 1 << 14
MAX_HEAD_DIM = 1 << 16
MAX_EMBD = 1 << 20
MAX_TOKENS = 1 << 32
MAX_SSM = 1 << 24
MAX_FF = 1 << 24


class HeaderReader:
    """Typed access to one header's keys, raising InvalidShape with the key's name."""

    def __init__(self, metadata: Mapping[str, object], source: str) -> None:
        self.md = metadata
        self.source = source
        self.notes: list[str] = []
        arch = metadata.get(Keys.General.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            self.fail(
                "The GGUF header has no general.architecture string, so its layers cannot be "
                "read; check that the file is a model (not a vocab or adapter) GGUF."
            )
        self.arch: str = arch

    def fail(self, message: str) -> NoReturn:
        """Raise InvalidShape with `message` and the source."""
        raise InvalidShape(message=message, source=self.source)

    def key(self, template: str) -> str:
        """The key for this architecture, e.g. '{arch}.block_count' -> 'llama.block_count'."""
        return template.format(arch=self.arch)

    def integer(
        self,
        template: str,
        *,
        default: int | None = None,
        minimum: int = 0,
        maximum: int = MAX_TOKENS,
    ) -> int:
        """A whole-number key; `default` when absent (None: the key is required)."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            if default is None:
                self.fail(
                    f"The GGUF header lacks {key}, which llama.cpp requires for a "
                    f"{self.arch} model; the file is incomplete or from an unknown converter."
                )
            return default
        return self.check_int(key, value, minimum, maximum)

    def check_int(self, key: str, value: object, minimum: int, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"GGUF key {key} is {value!r}, not a whole number; the header is damaged.")
        if not minimum <= value <= maximum:
            self.fail(
                f"GGUF key {key} is {value}, outside the plausible range {minimum}..{maximum}; "
                "the header is damaged or hostile."
            )
        return value

    def per_layer(
        self, template: str, n_layer: int, default: Sequence[int], maximum: int
    ) -> list[int]:
        """A key that is one number for every layer or an array of one number per layer."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            return list(default)
        if isinstance(value, list):
            if len(value) != n_layer:
                self.fail(
                    f"GGUF key {key} has {len(value)} entries but the model has {n_layer} "
                    "layers; the header is inconsistent."
                )
            return [self.check_int(key, v, 0, maximum) for v in value]
        return [self.check_int(key, value, 0, maximum)] * n_layer

    def flags(self, template: str, n_layer: int) -> list[bool] | None:
        """A per-layer bool array (ints 0/1 accepted), None when absent."""
        key = self.key(template)
        value = self.md.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != n_layer:
            self.fail(
                f"GGUF key {key} should be a list of {n_layer} booleans (one per layer) but is "
                f"{describe(value)}; the header is inconsistent."
            )
        out: list[bool] = []
        for v in value:
            if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
                out.append(bool(v))
            else:
                self.fail(f"GGUF key {key} holds {v!r}, not a boolean; the header is damaged.")
        return out


def describe(value: object) -> str:
    """A value as an error message names it: absent, a list of N, or its repr."""
    if value is None:
        return "absent"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return repr(value)
