"""Generate the Python and Go code of the protos, or check that the committed code matches.

Python comes from grpcio-tools' protoc with the mypy-protobuf plugins (pinned in pyproject.toml);
Go from Debian's protoc with protoc-gen-go and protoc-gen-go-grpc (the Makefile installs them with
apt-get; their versions are pinned below because each writes its version into the files).
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
GO_SUFFIXES = (".pb.go",)
# The Go tree, and the module path every proto's go_package starts with (gen/go/go.mod).
GO_DIR = Path("gen/go")
GO_MODULE = "gitea.mynodes.xyz/ilker/llmgw/gen/go"
# What `--version` answers for the tools the committed Go code was generated with: Debian 12's
# protobuf-compiler 3.21.12, protoc-gen-go 1.28.1 and protoc-gen-go-grpc 1.33.3 (which calls
# itself 1.0). Another version writes other headers, so it is refused rather than drifting.
GO_TOOLS = {
    "protoc": "libprotoc 3.21.12",
    "protoc-gen-go": "protoc-gen-go v1.28.1",
    "protoc-gen-go-grpc": "protoc-gen-go-grpc 1.0",
}


def includes() -> list[Path]:
    """The include roots besides protos/: the well-known types and google/api (HTTP rules).

    google/api/annotations.proto and http.proto come from googleapis-common-protos, which
    grpcio-status installs; they are read from there rather than copied into the tree.
    """
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    spec = importlib.util.find_spec("google.api.annotations_pb2")
    if spec is None or spec.origin is None:
        raise SystemExit("googleapis-common-protos is not installed (pip install -e .)")
    googleapis = Path(spec.origin).parent.parent.parent
    return [wkt, googleapis]


def sources() -> list[str]:
    """The protos, relative to protos/."""
    return sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))


def generate_python(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins into `out`."""
    plugin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{PROTOS}",
        *(f"-I{inc}" for inc in includes()),
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *sources(),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.name.endswith(SUFFIXES))


def check_go_tools() -> None:
    """Refuse to generate Go with tools missing or of other versions than the pinned ones."""
    for tool, want in GO_TOOLS.items():
        path = shutil.which(tool)
        if path is None:
            raise SystemExit(f"{tool} is not installed: run `make go-tools` (apt-get)")
        got = subprocess.run(
            [path, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if got != want:
            raise SystemExit(f"{tool} answers {got!r}; the committed Go code needs {want!r}")


def generate_go(out: Path) -> list[Path]:
    """Run Debian's protoc with protoc-gen-go and protoc-gen-go-grpc into `out`/gen/go."""
    check_go_tools()
    go_out = out / GO_DIR
    go_out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTOS}",
        *(f"-I{inc}" for inc in includes()),
        f"--go_out={go_out}",
        f"--go_opt=module={GO_MODULE}",
        f"--go-grpc_out={go_out}",
        f"--go-grpc_opt=module={GO_MODULE}",
        *sources(),
    ]
    done = subprocess.run(args, cwd=PROTOS, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"protoc (Go) failed: {done.stderr.strip()}")
    return sorted(p.relative_to(out) for p in go_out.rglob("*") if p.name.endswith(GO_SUFFIXES))


def write_descriptor_set(path: Path) -> None:
    """The protos and everything they import, with source info, as one FileDescriptorSet: the
    input `buf lint` and `buf generate` read offline (buf alone would fetch google/api from
    the Buf Schema Registry; here it comes from googleapis-common-protos)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTOS}",
        *(f"-I{inc}" for inc in includes()),
        "--include_imports",
        "--include_source_info",
        f"--descriptor_set_out={path}",
        *sources(),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def committed() -> list[Path]:
    """The generated files that are in the tree now."""
    found = [p.relative_to(ROOT) for p in (ROOT / "llmgw").rglob("*") if p.name.endswith(SUFFIXES)]
    found += [
        p.relative_to(ROOT) for p in (ROOT / GO_DIR).rglob("*") if p.name.endswith(GO_SUFFIXES)
    ]
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the generated code under this folder")
    parser.add_argument("--check", action="store_true", help="fail when the tree has drifted")
    parser.add_argument(
        "--descriptor-set", type=Path, help="write the protos as a FileDescriptorSet (for buf)"
    )
    opts = parser.parse_args()
    if opts.descriptor_set is not None:
        write_descriptor_set(opts.descriptor_set.resolve())
        return 0
    if opts.out is not None:
        out = opts.out.resolve()
        # Files of a removed proto must not linger in the Go tree.
        for stale in (out / GO_DIR).rglob("*"):
            if stale.name.endswith(GO_SUFFIXES):
                stale.unlink()
        generate_python(out)
        generate_go(out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate_python(Path(tmp)) + generate_go(Path(tmp))
        drift = sorted(set(fresh) ^ set(committed()))
        drift += [
            p
            for p in fresh
            if (ROOT / p).exists() and not filecmp.cmp(Path(tmp) / p, ROOT / p, False)
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
