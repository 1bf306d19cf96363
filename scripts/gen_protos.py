"""Generate the Python code of the protos, or check that the committed code matches."""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins into `out`."""
    files = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    plugin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.name.endswith(SUFFIXES))


def committed() -> list[Path]:
    """The generated files that are in the tree now."""
    found = [p.relative_to(ROOT) for p in (ROOT / "llmgw").rglob("*") if p.name.endswith(SUFFIXES)]
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the generated code under this folder")
    parser.add_argument("--check", action="store_true", help="fail when the tree has drifted")
    opts = parser.parse_args()
    if opts.out is not None:
        generate(opts.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        drift = sorted(set(fresh) ^ set(committed()))
        drift += [
            p for p in fresh if p.exists() and not filecmp.cmp(Path(tmp) / p, ROOT / p, False)
        ]
        if drift:
            for p in drift:
                print(f"generated code drifted from protos/: {p}", file=sys.stderr)
            print("run `make proto` and commit the result", file=sys.stderr)
            return 1
    print(f"generated code matches protos/ ({len(fresh)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
