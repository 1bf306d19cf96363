"""pyproject.toml's ranges against what the tree needs: the protobuf runtime the committed
gencode checks for at import, the lock the image installs from, and the gpu extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = ROOT / "deploy" / "constraints.txt"


def requirements(extra: str = "") -> dict[str, Requirement]:
    listed = PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"]
    reqs = [Requirement(r) for r in listed]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def locked() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name] = Version(version)
    return pins


def test_protobuf_range_starts_at_the_committed_gencode() -> None:
    """Every *_pb2.py refuses a runtime older than the protobuf that generated it: the range's
    floor is that version, so a resolver over a protobuf 6 environment must upgrade it, and it
    stops before the next major."""
    gencode = {
        m[1]
        for path in (ROOT / "llmgw").glob("*/v1/*_pb2.py")
        if (m := re.search(r"# Protobuf Python Version: (\S+)", path.read_text()))
    }
    assert len(gencode) == 1, gencode
    (version,) = gencode
    spec = requirements()["protobuf"].specifier
    assert Version(version) in spec and f">={version}" in str(spec).split(","), spec
    assert not spec.contains("6.33.0") and not spec.contains("8.0.0"), spec


def test_every_runtime_dependency_is_bounded_above() -> None:
    """Pinned (==) or bounded below the next major (<)."""
    for extra in ("", "gpu"):
        for name, req in requirements(extra).items():
            ops = {s.operator for s in req.specifier}
            assert ops & {"==", "<"}, f"{name} is open above: {req}"


def test_the_gpu_extra_is_the_agents_nvml() -> None:
    """fleet_svc/agent/cards.py imports pynvml, which nvidia-ml-py ships."""
    assert "pynvml" in (ROOT / "fleet_svc" / "agent" / "cards.py").read_text()
    assert set(requirements("gpu")) == {"nvidia-ml-py"}


def test_the_lock_satisfies_every_range() -> None:
    """The image installs the lock then the package with --no-deps: each runtime and gpu
    requirement is pinned there inside its range (`make lock` rewrites it)."""
    pins = locked()
    for extra in ("", "gpu"):
        for name, req in requirements(extra).items():
            assert name in pins, f"{name} is not in {LOCK.name}: run `make lock`"
            assert pins[name] in req.specifier, f"{name}=={pins[name]} is outside {req}"


def test_the_dockerfile_installs_the_lock_before_the_code() -> None:
    """The dependency layer comes from the lock alone, before any source is copied."""
    lines = (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
    first_code = next(i for i, line in enumerate(lines) if line.startswith("COPY llmgw"))
    lock_install = next(i for i, line in enumerate(lines) if "-r constraints.txt" in line)
    assert lock_install < first_code
    assert "!deploy/constraints.txt" in (ROOT / ".dockerignore").read_text().splitlines()
