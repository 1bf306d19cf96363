"""Which layers of a GGUF model slide and over what window, by llama.cpp's rule for each
architecture with sliding-window (or chunked) attention (src/models/<arch>.cpp)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gguf import Keys

from planner_svc.domain.gguf_header import MAX_LAYERS, HeaderReader, describe
from planner_svc.domain.gguf_recurrent import LFM2_ARCHS


@dataclass(frozen=True)
class _SwaRule:
    """How one architecture's `load_arch_hparams` decides its sliding layers and window."""

    pattern: int | None
    """Every `pattern`-th layer is dense; None: the file must carry the per-layer bool array."""
    dense_first: bool = False
    """The dense layer opens each group (il % n == 0) instead of closing it."""
    window_default: int | None = None
    """Window when the key is absent; None: llama.cpp requires the key."""
    needs_positive_window: bool = False
    """Sliding only when the resolved window is > 0; otherwise every layer is dense."""
    window_forced: int = 0
    """A window llama.cpp imposes whatever the file says (0: the file's)."""
    only_block_count: int = 0
    """Sliding only for this block_count (0: always)."""
    note: str = ""


# Per-architecture defaults from src/models/<arch>.cpp (notes §5).
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, window_default=4096),
    "gemma3": _SwaRule(6, window_default=0, needs_positive_window=True),
    "gemma3n": _SwaRule(5),
    "gemma4": _SwaRule(None),
    "gemma-embedding": _SwaRule(6),
    "gpt-oss": _SwaRule(2),
    "cohere2": _SwaRule(4),
    "cohere2moe": _SwaRule(4, dense_first=True),
    # llama4.cpp: chunked attention over 8192-token chunks on 3 of 4 layers unless the file
    # says sliding_window = 0.
    "llama4": _SwaRule(
        4,
        window_default=8192,
        needs_positive_window=True,
        window_forced=8192,
        note="llama4: chunked attention (8192-token chunks) on 3 of every 4 layers",
    ),
    "exaone4": _SwaRule(4, window_default=4096, only_block_count=64),
    "exaone-moe": _SwaRule(4),
    "olmo2": _SwaRule(4, window_default=0, needs_positive_window=True),
    "smallthinker": _SwaRule(
        4, dense_first=True, window_default=0, needs_positive_window=True, window_forced=4096
    ),
    "afmoe": _SwaRule(4, window_default=0, needs_positive_window=True),
    "mellum": _SwaRule(4, window_default=0, needs_positive_window=True),
    "muse-glimmer": _SwaRule(4),
    "plamo3": _SwaRule(8, window_default=0, needs_positive_window=True),
    "laguna": _SwaRule(4, dense_first=True, window_default=0, needs_positive_window=True),
    "granite_swa": _SwaRule(None),
    "step35": _SwaRule(None),
    "mimo2": _SwaRule(None),
}


def sliding_layers(
    reader: HeaderReader,
    n_layer: int,
    n_main: int,
    attends: Sequence[bool],
    recurrent: Sequence[bool],
) -> tuple[list[bool], int]:
    """Per layer whether it slides, and the window (0 when none slides)."""
    none = [False] * n_layer
    window_key = reader.key(Keys.Attention.SLIDING_WINDOW)
    file_window = reader.md.get(window_key)
    if reader.arch == "phi3":
        # phi3.cpp: "Phi SWA is currently disabled" (llama.cpp PR 13676): every layer full.
        if file_window:
            reader.notes.append(
                f"phi3: sliding_window {file_window} ignored, as llama.cpp disables Phi SWA"
            )
        return none, 0
    if reader.arch in LFM2_ARCHS:
        # lfm2.cpp: with a window > 0 every attention layer slides.
        window = reader.integer(Keys.Attention.SLIDING_WINDOW, default=0)
        if window > 0 and reader.arch == "lfm2":
            return [attends[il] and not recurrent[il] for il in range(n_layer)], window
        return none, 0
    rule = _SWA_RULES.get(reader.arch)
    if rule is None:
        if file_window:
            reader.notes.append(
                f"{reader.arch}: sliding_window {file_window} ignored, as llama.cpp does for "
                "this architecture; every layer is counted in full"
            )
        return none, 0
    if rule.only_block_count and n_layer != rule.only_block_count:
        return none, 0
    window = reader.integer(Keys.Attention.SLIDING_WINDOW, default=rule.window_default)
    if rule.needs_positive_window and window <= 0:
        return none, 0
    if rule.window_forced:
        window = rule.window_forced
    is_swa = _swa_pattern(reader, rule, n_layer, n_main)
    if any(is_swa) and window <= 0:
        reader.fail(
            f"GGUF key {window_key} is {window} but {reader.arch} layers slide; the header "
            "is inconsistent."
        )
    if rule.note:
        reader.notes.append(rule.note)
    return is_swa, window if any(is_swa) else 0


def _swa_pattern(reader: HeaderReader, rule: _SwaRule, n_layer: int, n_main: int) -> list[bool]:
    # llama-model.cpp load_swa_pattern: a per-layer bool array under
    # sliding_window_pattern wins; else an integer there overrides the default n.
    key = reader.key(Keys.Attention.SLIDING_WINDOW_PATTERN)
    given = reader.md.get(key)
    if isinstance(given, list):
        flags = reader.flags(Keys.Attention.SLIDING_WINDOW_PATTERN, n_layer)
        assert flags is not None
        return flags
    if rule.pattern is None:
        reader.fail(
            f"{reader.arch} files must say which layers slide in {key} (one boolean per "
            f"layer), but it is {describe(given)}; re-convert the model."
        )
    n = rule.pattern
    if given is not None:
        n = reader.check_int(key, given, 0, MAX_LAYERS)
    # llama-hparams.cpp set_swa_pattern: n = 0 slides every layer, n = 1 none; otherwise
    # the last (or, dense_first, the first) layer of each group of n is dense. nextn
    # blocks never slide.
    out = []
    for il in range(n_layer):
        if il >= n_main:
            out.append(False)
        elif n == 0:
            out.append(True)
        elif rule.dense_first:
            out.append(il % n != 0)
        else:
            out.append(il % n < n - 1)
    return out
