"""The contract's values as typed data, shared by the planner, the fleet and the CLI: a catalog
entry (`Model`) with its `Profile`s, the hardware `Inventory`, and the checks that keep their
numbers sane. Pure: no grpc, no I/O; the proto mappings live in `llmgw.rpc.common`."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from llmgw.refusal import Refusal
from llmgw.shape import ModelShape

MAX_COUNT = 1 << 20
"""A ceiling on cards, nodes and replicas in a request."""

MAX_TOKENS_FIELD = 1 << 40
"""A ceiling on a model's token counts as the contract accepts them (the planner has its own,
lower, for what it sizes)."""

INT64 = "int64"
"""Field metadata key: the contract carries this number as int64 (protobuf's JSON writes it as
a string). Conversions and rows read it from the field, so no list of fields is kept apart."""
MAXIMUM = "maximum"
"""Field metadata key: the largest value the contract accepts for this number (else
`MAX_COUNT`)."""


@dataclass
class InvalidValue(Refusal):
    """A value of the contract is missing or out of range; `field` names it (for BadRequest)."""

    field: str = ""
    reason: str = "INVALID_REQUEST"


def checked_count(value: int, field: str, maximum: int = MAX_COUNT) -> int:
    """`value`, refused when negative or above `maximum`.

    Raises:
        InvalidValue: out of range, naming `field`.
    """
    if value < 0 or value > maximum:
        raise InvalidValue(f"{field} is {value}: it must be between 0 and {maximum}", field=field)
    return value


MAX_ENGINE_VERSIONS = 64
MAX_VERSION_CHARS = 64
"""A node's engine versions: at most 64 engines, names and versions of at most 64 characters."""


def checked_versions(versions: Mapping[str, str], field: str) -> tuple[tuple[str, str], ...]:
    """A node's (engine, version) pairs, sorted by engine, refused when past the bounds.

    Raises:
        InvalidValue: too many, or a name or version too long, naming `field`.
    """
    if not versions:
        return ()
    if len(versions) > MAX_ENGINE_VERSIONS:
        raise InvalidValue(
            f"{field} names {len(versions)} engines: at most {MAX_ENGINE_VERSIONS}", field=field
        )
    for name, version in versions.items():
        if len(name) > MAX_VERSION_CHARS or len(version) > MAX_VERSION_CHARS:
            raise InvalidValue(
                f"{field}[{name[:MAX_VERSION_CHARS]!r}]: engine names and versions are at most "
                f"{MAX_VERSION_CHARS} characters",
                field=field,
            )
    return tuple(sorted(versions.items()))


@dataclass(frozen=True)
class Profile:
    """A way to serve a model: an engine, its arguments and the cards it takes."""

    name: str
    engine: str
    args: tuple[str, ...] = ()
    gpu_class: str = ""
    gpus_per_node: int = 0
    tp: int = 0
    pp: int = 0
    nodes: int = 0
    min_memory_gb: int = 0
    cpu_only: bool = False
    replicas: int = 0
    engine_version: str = ""
    """The engine's version (e.g. "0.10.2"); empty: the planner applies the newest rules it
    knows."""

    def with_args(self, args: tuple[str, ...]) -> Profile:
        """This profile with other engine arguments, as every sizing makes it. A copy of the
        fields rather than `dataclasses.replace`, which walks them (2.2 us against 0.4 on
        the sizing path): a Profile derives nothing from its fields (no `__post_init__`;
        tests/unit/test_inventory.py holds it so), so the copy is the whole value."""
        copy = object.__new__(Profile)
        copy.__dict__.update(self.__dict__, args=args)
        return copy

    @property
    def on_cpu(self) -> bool:
        """Whether the profile runs in RAM (declared CPU-only, or with no card class)."""
        return self.cpu_only or not self.gpu_class

    @property
    def cards(self) -> int:
        """Cards of one replica: per node (or tensor parallel) times nodes (or pipeline); a
        replica on several nodes with its cards a node set takes those on each (its tp × pp
        may then span nodes or stack stages on one: `planner_svc/domain/gang_split.py`)."""
        if self.nodes > 1 and self.gpus_per_node > 0:
            return self.gpus_per_node * self.nodes
        return max(self.gpus_per_node, self.tp, 1) * max(self.nodes, self.pp, 1)


@dataclass(frozen=True)
class Model:
    """A catalog entry: where the weights are, the context served and the profiles."""

    name: str
    source: str = ""
    files: tuple[tuple[str, int], ...] = ()
    context_length: int = field(default=0, metadata={INT64: True, MAXIMUM: MAX_TOKENS_FIELD})
    max_output: int = field(default=0, metadata={INT64: True, MAXIMUM: MAX_TOKENS_FIELD})
    profiles: tuple[Profile, ...] = ()
    shape: ModelShape | None = None

    @property
    def files_bytes(self) -> int:
        """The origin files' sizes added up (0 when none are known)."""
        return sum(size for _, size in self.files)


@dataclass(frozen=True)
class Scalar:
    """One scalar field of a contract value, as conversions and store rows walk it: its name,
    its kind (str, int, bool, or tuple for a list of strings), whether the contract carries it
    as int64, and the largest value accepted for a number."""

    name: str
    kind: type
    int64: bool = False
    maximum: int = MAX_COUNT


_SCALAR_KINDS: dict[object, type] = {str: str, int: int, bool: bool, tuple[str, ...]: tuple}


_WALKED: dict[type, tuple[tuple[Scalar, ...], frozenset[str]]] = {}


def scalar_fields(cls: type) -> tuple[tuple[Scalar, ...], frozenset[str]]:
    """The scalar fields of the dataclass `cls` in declaration order, and the names of its
    other fields (nested values: each conversion lays those out itself and checks it knows
    them all, so a new field is either carried by this walk or refused at import)."""
    hit = _WALKED.get(cls)
    if hit is not None:
        return hit
    hints = typing.get_type_hints(cls)
    out: list[Scalar] = []
    nested: set[str] = set()
    for f in fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        kind = _SCALAR_KINDS.get(hints[f.name])
        if kind is None:
            nested.add(f.name)
            continue
        out.append(
            Scalar(
                f.name,
                kind,
                int64=bool(f.metadata.get(INT64, False)),
                maximum=int(f.metadata.get(MAXIMUM, MAX_COUNT)),
            )
        )
    _WALKED[cls] = (tuple(out), frozenset(nested))
    return _WALKED[cls]


def check_nested(cls: type, known: frozenset[str], where: str) -> None:
    """Refuse, at import, a contract dataclass whose nested fields are not the ones `where`
    lays out (a field added to the model must be carried there, not dropped).

    Raises:
        TypeError: naming the fields `where` does not know.
    """
    _, nested = scalar_fields(cls)
    if nested != known:
        raise TypeError(
            f"{where} lays out {sorted(known)} of {cls.__name__}'s nested fields, which are "
            f"{sorted(nested)}: carry the new ones there"
        )


@dataclass(frozen=True)
class Node:
    """One node of the inventory."""

    name: str
    gpu_class: str = ""
    gpus: int = 0
    free_gpus: int = 0
    gpu_memory_bytes: int = 0
    memory_bytes: int = 0
    gpu_cuda_memory_bytes: int = 0
    """One card's memory as CUDA reports it (below NVML's `gpu_memory_bytes`); 0: not known."""
    engine_versions: tuple[tuple[str, str], ...] = ()
    """(engine, version) the node runs, as its agent reported them, sorted by engine."""


def _class_key(gpu_class: str) -> str:
    """A card class as classes are compared: case and surrounding blanks aside."""
    return gpu_class.strip().lower()


@dataclass(frozen=True)
class Inventory:
    """The nodes the planner plans against."""

    nodes: tuple[Node, ...] = field(default_factory=tuple)
    by_class: Mapping[str, tuple[Node, ...]] = field(
        init=False, compare=False, repr=False, default_factory=dict
    )
    """The nodes with cards, by their class as spelled and as compared (`_class_key`):
    derived from `nodes` once, when the inventory is made, and never changed after."""
    reports_versions: bool = field(init=False, compare=False, repr=False, default=False)
    """Whether any node reported an engine version (derived from `nodes` as `by_class` is)."""

    def __post_init__(self) -> None:
        found: dict[str, list[Node]] = {}
        for n in self.nodes:
            if n.gpus > 0:
                found.setdefault(_class_key(n.gpu_class), []).append(n)
        index = {key: tuple(nodes) for key, nodes in found.items()}
        for n in self.nodes:
            index.setdefault(n.gpu_class, index.get(_class_key(n.gpu_class), ()))
        # A plain dict, typed read-only: through a mapping proxy a lookup takes 27 ns, not 16.
        object.__setattr__(self, "by_class", index)
        object.__setattr__(self, "reports_versions", any(n.engine_versions for n in self.nodes))

    def of_class(self, gpu_class: str) -> tuple[Node, ...]:
        """Nodes whose cards are of `gpu_class` (compared case-insensitively)."""
        hit = self.by_class.get(gpu_class)
        if hit is None:
            hit = self.by_class.get(_class_key(gpu_class), ())
        return hit

    def largest_count(self, gpu_class: str) -> int:
        """The most cards any node of the class has (0 when none)."""
        return max((n.gpus for n in self.of_class(gpu_class)), default=0)

    def engine_versions(self, gpu_class: str, engine: str) -> tuple[str, ...]:
        """The versions of `engine` the nodes of `gpu_class` report (distinct, sorted; an
        engine's aliases are the caller's to resolve). Nodes of no class count for a CPU
        profile's empty class."""
        want = gpu_class.strip().lower()
        nodes = self.of_class(gpu_class) if want else self.nodes
        return tuple(
            sorted({v for n in nodes for name, v in n.engine_versions if name == engine and v})
        )
