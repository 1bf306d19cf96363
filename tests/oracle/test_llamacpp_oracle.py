"""The planner's llama.cpp cache against the real llama.cpp, over a grid of models and settings.

For every generated combination (model geometry x context x slots/unified x cache types x flash
attention x ubatch x swa_full), the llama-server arguments go through the planner
(`settings_from_args` + `llamacpp_cache`) and, independently, through this file's own reading
of how llama-server turns them into a llama.cpp context (`library_params`); llama.cpp then
creates that context on a small GGUF of the geometry and its printed cache lines must equal
the planner's numbers, and what one refuses the other must refuse.

Needs the libllama that `make llama-server` builds (tests/oracle/libllama.py); without it every
run fails with how to build it, unless LLMGW_SKIP_ORACLE=1 (then it is skipped).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import gguf
import pytest

from llmgw.engines.errors import EngineRefuses
from llmgw.engines.llamacpp import (
    MIB,
    LlamaCppCache,
    LlamaCppSettings,
    llamacpp_cache,
    llamacpp_overhead_bytes,
    settings_from_args,
)
from llmgw.shape import ModelShape
from tests.oracle import libllama
from tests.oracle.libllama import BUILD_HINT
from tests.oracle.llamacpp_run import (
    ContextParams,
    Printed,
    llama_cpp_missing,
    printed_mib,
    run_contexts,
)
from tests.oracle.models import GEOMETRIES, Geometry, geometry, inline_shape, write_model

pytestmark = pytest.mark.oracle

SKIP = os.environ.get("LLMGW_SKIP_ORACLE") == "1"

# The grid. Contexts include non-multiples of 256 and of the slot count; None = no --ctx-size.
CONTEXTS: tuple[int | None, ...] = (None, 0, 300, 1000, 3000, 4096)
# (slots, unified flag): None slots = no --parallel (llama-server's auto); flag None = absent.
SLOTS: tuple[tuple[int | None, str | None], ...] = (
    (None, None),
    (None, "no-kvu"),
    (1, None),
    (2, None),
    (3, None),
    (4, None),
    (2, "kvu"),
    (3, "kvu"),
    (4, "no-kvu"),
)
CACHE_TYPES = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0"))
SWA_CACHE_TYPES = (("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q4_0"))
# The other cache types llama-server takes, on two models.
EXTRA_CACHE_TYPES = (("bf16", "q5_1"), ("f32", "iq4_nl"), ("q4_1", "q5_0"))
EXTRA_TYPE_MODELS = frozenset({"llama-gqa-64", "llama-gqa-128"})
FLASH_ATTN: tuple[str | None, ...] = (None, "on", "off")
# (ubatch, batch): the SWA cache depends on the ubatch, which the batch caps.
BATCHES: tuple[tuple[int | None, int | None], ...] = ((None, None), (128, None), (None, 100))


@dataclass(frozen=True)
class Case:
    """One grid point: a model and llama-server settings (None = flag absent)."""

    model: str
    ctx: int | None
    slots: int | None
    unified: str | None
    type_k: str
    type_v: str
    flash_attn: str | None
    ubatch: int | None
    batch: int | None
    swa_full: bool
    spelling: int
    """Which spelling of the flags to use (long/short, `--flag value` or `--flag=value`)."""

    @property
    def id(self) -> str:
        """A readable test id."""
        parts = [
            self.model,
            f"c{self.ctx}" if self.ctx is not None else "c-",
            f"np{self.slots}" if self.slots is not None else "np-",
            self.unified or "",
            f"{self.type_k}-{self.type_v}",
            f"fa{self.flash_attn or '-'}",
            f"ub{self.ubatch}" if self.ubatch else "",
            f"b{self.batch}" if self.batch else "",
            "swafull" if self.swa_full else "",
        ]
        return "-".join(p for p in parts if p)

    def args(self) -> list[str]:
        """The llama-server arguments, spelled one of four ways."""
        long_form, inline = self.spelling % 2 == 0, self.spelling % 4 >= 2
        out: list[str] = ["--model", f"{self.model}.gguf"]

        def flag(long: str, short: str, value: object) -> None:
            name = long if long_form else short
            out.extend([f"{name}={value}"] if inline else [name, str(value)])

        if self.ctx is not None:
            flag("--ctx-size", "-c", self.ctx)
        if self.slots is not None:
            flag("--parallel", "-np", self.slots)
        if self.unified == "kvu":
            out.append("--kv-unified" if long_form else "-kvu")
        elif self.unified == "no-kvu":
            out.append("--no-kv-unified" if long_form else "-no-kvu")
        if self.type_k != "f16" or self.spelling % 3 == 0:
            flag("--cache-type-k", "-ctk", self.type_k)
        if self.type_v != "f16" or self.spelling % 3 == 1:
            flag("--cache-type-v", "-ctv", self.type_v)
        if self.flash_attn is not None:
            flag("--flash-attn", "-fa", self.flash_attn)
        if self.ubatch is not None:
            flag("--ubatch-size", "-ub", self.ubatch)
        if self.batch is not None:
            flag("--batch-size", "-b", self.batch)
        if self.swa_full:
            out.append("--swa-full")
        out.extend(["--n-gpu-layers", "0"])
        return out


# The planner's refusal (a phrase of its detail) -> the reason llama.cpp prints for it
# (src/llama-context.cpp:3835-3862, llama_init_from_model).
REFUSAL_REASONS = {
    "K head size": "K cache type",
    "V head size": "V cache type",
    "a quantized V cache": "quantized V cache requires flash_attn",
    "refuses different cache types": "does not support different K",
}


def generate_cases() -> list[Case]:
    """Every combination of the grid, per model; sliding-window models add ubatch/swa_full."""
    cases: list[Case] = []
    for g in GEOMETRIES:
        sliding = g.window > 0
        types: tuple[tuple[str, str], ...] = SWA_CACHE_TYPES if sliding else CACHE_TYPES
        if g.name in EXTRA_TYPE_MODELS:
            types += EXTRA_CACHE_TYPES
        batches = BATCHES if sliding else ((None, None),)
        swa_fulls = (False, True) if sliding else (False,)
        grid = itertools.product(CONTEXTS, SLOTS, types, FLASH_ATTN, batches, swa_fulls)
        for i, (ctx, (slots, unified), (tk, tv), fa, (ub, b), full) in enumerate(grid):
            cases.append(Case(g.name, ctx, slots, unified, tk, tv, fa, ub, b, full, i))
    return cases


def library_params(case: Case, g: Geometry, decode: bool) -> ContextParams:
    """The llama.cpp context llama-server creates for `case`, read from its source.

    tools/server/server.cpp:156-160: --parallel unset -> 4 slots and a unified cache (whatever
    --no-kv-unified says); common/common.h: unified off, f16 caches, flash attention auto,
    ubatch 512, batch 2048, swa_full off (the library's own default is on); common/fit.cpp:
    196-272: no --ctx-size (or 0) with --fit on -> the trained context for every stream.
    """
    slots, unified = case.slots, case.unified == "kvu"
    if slots is None:
        slots, unified = 4, True
    n_ctx = case.ctx or g.context_length * (1 if unified else slots)
    return ContextParams(
        n_ctx=n_ctx,
        n_seq_max=slots,
        kv_unified=unified,
        type_k=case.type_k,
        type_v=case.type_v,
        flash_attn=case.flash_attn or "auto",
        n_batch=case.batch or 2048,
        n_ubatch=case.ubatch or 512,
        swa_full=case.swa_full,
        decode=decode,
    )


def planner(
    shape: ModelShape, case: Case
) -> tuple[LlamaCppSettings, LlamaCppCache | EngineRefuses]:
    """The planner's settings for `case` and its cache, or its refusal."""
    settings = settings_from_args(case.args())
    try:
        return settings, llamacpp_cache(shape, settings)
    except EngineRefuses as refusal:
        return settings, refusal


def gguf_shape_reader() -> Callable[[Path], ModelShape] | None:
    """`shape_from_gguf` over a written file's header, when that module is in the tree."""
    if importlib.util.find_spec("planner_svc.domain.gguf_shape") is None:
        return None
    module = importlib.import_module("planner_svc.domain.gguf_shape")

    def read(path: Path) -> ModelShape:
        reader = gguf.GGUFReader(path)
        metadata = {name: f.contents() for name, f in reader.fields.items()}
        shape: ModelShape = module.shape_from_gguf(metadata, file_bytes=path.stat().st_size)
        return shape

    return read


CASES = generate_cases()
_AVAILABLE = libllama.built()


@dataclass
class Oracle:
    """Written models, their shapes, and llama.cpp's output for every case; or why
    llama.cpp cannot run (`missing`), reported as a failure once."""

    printed: dict[Case, Printed]
    shapes: dict[str, list[tuple[str, ModelShape]]]
    missing: str | None = None
    reported: bool = False


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    """Write every model, run every case through llama.cpp (one child per model, two at a
    time), and read each model's shape inline and, if present, through shape_from_gguf."""
    missing = llama_cpp_missing()
    if missing is not None:
        return Oracle({}, {}, missing)
    directory = tmp_path_factory.mktemp("llamacpp-oracle")
    reader = gguf_shape_reader()
    shapes: dict[str, list[tuple[str, ModelShape]]] = {}
    jobs: list[tuple[Path, list[Case], list[ContextParams]]] = []
    for g in GEOMETRIES:
        path = write_model(g, directory / f"{g.name}.gguf")
        shapes[g.name] = [("inline", inline_shape(g))]
        if reader is not None:
            shapes[g.name].append(("shape_from_gguf", reader(path)))
        cases = [c for c in CASES if c.model == g.name]
        inline = shapes[g.name][0][1]
        params = [
            library_params(c, g, isinstance(planner(inline, c)[1], EngineRefuses)) for c in cases
        ]
        jobs.append((path, cases, params))
    # Longest first, so the two workers finish together.
    jobs.sort(key=lambda job: -len(job[1]))
    printed: dict[Case, Printed] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for (_, cases, _), results in zip(
            jobs, pool.map(lambda job: run_contexts(job[0], job[2]), jobs), strict=True
        ):
            printed.update(zip(cases, results, strict=True))
    return Oracle(printed, shapes)


def _params() -> Iterator[object]:
    """The grid as pytest params, or one placeholder when llama.cpp is not installed."""
    if not _AVAILABLE:
        yield pytest.param(None, id="llama-cpp-missing")
        return
    for case in CASES:
        yield pytest.param(case, id=case.id)


def test_grid_covers_every_geometry() -> None:
    """The generated grid has cases for every model geometry and more than a thousand in all."""
    assert {c.model for c in CASES} == {g.name for g in GEOMETRIES}
    assert len(CASES) > 1000


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(_params()))
def test_planner_matches_llamacpp(oracle: Oracle, case: Case | None) -> None:
    """The planner's cells and bytes (or refusal) equal what llama.cpp printed for the case,
    and its compute-buffer estimate is at least what llama.cpp reserved."""
    missing = BUILD_HINT if case is None else oracle.missing
    if missing is not None:
        if SKIP:
            pytest.skip(f"LLMGW_SKIP_ORACLE=1: {missing}")
        if not oracle.reported:
            oracle.reported = True
            pytest.fail(missing)
        pytest.skip("llama.cpp cannot run: see the first oracle test's failure")
    assert case is not None
    printed = oracle.printed[case]
    for source, shape in oracle.shapes[case.model]:
        settings, want = planner(shape, case)
        _check(case, source, settings, want, printed)
        if isinstance(want, LlamaCppCache) and printed.compute_mib:
            overhead = llamacpp_overhead_bytes(shape, case.args(), 1)
            assert overhead >= max(printed.compute_mib.values()) * MIB, (
                f"{case.id}: compute buffers {printed.compute_mib} MiB exceed the estimate"
            )


def _check(
    case: Case,
    source: str,
    settings: LlamaCppSettings,
    want: LlamaCppCache | EngineRefuses,
    got: Printed,
) -> None:
    """Assert one planner answer (from the `source` shape) against llama.cpp's output."""
    where = f"{case.id} ({source} shape, args {' '.join(case.args())})"
    if isinstance(want, EngineRefuses):
        assert not got.ok or got.decoded is False, (
            f"{where}: the planner refuses ({want.message}) but llama.cpp created the context "
            "and decoded finite logits"
        )
        if not got.ok and not got.crashed:
            reason = next((ll for ours, ll in REFUSAL_REASONS.items() if ours in want.detail), "")
            assert reason and reason in got.error, (
                f"{where}: refused for other reasons: planner {want.detail!r}, "
                f"llama.cpp {got.error!r}"
            )
        return
    assert got.ok, f"{where}: llama.cpp refused: {got.error or 'crashed'}"
    assert (got.n_ctx, got.n_ctx_seq) == (want.n_ctx_tokens, want.n_ctx_seq_tokens), where
    assert got.flash_attn == want.flash_attn, f"{where}: flash attention"
    slots = settings.slots
    g = geometry(case.model)
    if g.recurrent:
        assert got.recurrent is not None, where
        assert (got.recurrent.cells, got.recurrent.size_mib) == (
            max(1, slots),
            printed_mib(want.recurrent_bytes),
        ), f"{where}: recurrent cells/MiB"
    if not g.hybrid and g.recurrent:
        assert not got.kv, where
        return
    lines = {line.role: line for line in got.kv}
    # A sliding-window cache always has a non-SWA part (src/llama-kv-cache-iswa.cpp): with no
    # full-attention layer (lfm2 with a window) it has the context's cells and no layers.
    full_cells = want.full_cells or (want.n_ctx_seq_tokens if g.window else 0)
    expected = {"base" if g.window else "kv": (full_cells, want.k_bytes, want.v_bytes)}
    if g.window:
        expected["swa"] = (want.swa_cells, want.swa_k_bytes, want.swa_v_bytes)
    if want.indexer_k_bytes:
        expected["indexer"] = (want.full_cells, want.indexer_k_bytes, 0)
    assert set(lines) == set(expected), where
    for role, (cells, k, v) in expected.items():
        line = lines[role]
        assert (line.cells, line.seqs, line.streams) == (cells, slots, want.streams), (
            f"{where}: {role} cells/seqs/streams"
        )
        assert (line.type_k, line.type_v) == (case.type_k, case.type_v), where
        assert (line.k_mib, line.v_mib, line.size_mib) == (
            printed_mib(k),
            printed_mib(v),
            printed_mib(k + v),
        ), f"{where}: {role} K/V/total MiB"
