"""Generate the Python and Go code of the protos, or check that the committed code matches.

Python comes from grpcio-tools' protoc with the mypy-protobuf plugins (pinned in pyproject.toml);
Go from the same protoc with protoc-gen-go and protoc-gen-go-grpc, which `make go-tools` installs
with `go install ...@VERSION` into ~/.cache/llmgw/tools/go/bin (LLMGW_GO_TOOLS overrides it).
Their versions are pinned below because each writes its version into the files.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import os
import re
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
# The published gRPC service config (round_robin, the retry policy), and its copy beside the
# Go client package, which embeds it (go:embed cannot reach outside its module): written by
# --out, compared by --check.
SERVICE_CONFIG = Path("llmgw/clients/service_config.json")
GO_SERVICE_CONFIG = Path("gen/go/client/service_config.json")
# The Go tree, and the module path every proto's go_package starts with (gen/go/go.mod).
GO_DIR = Path("gen/go")
GO_MODULE = "gitea.mynodes.xyz/ilker/llmgw/gen/go"
# The Go plugins and the versions the committed Go code was generated with; `make go-tools`
# (this script's --go-tools) installs exactly these from the Go module proxy. Each writes its
# version into the files, so another version is refused rather than reported as drift.
GO_PLUGINS = {
    "protoc-gen-go": ("google.golang.org/protobuf/cmd/protoc-gen-go", "v1.36.12"),
    "protoc-gen-go-grpc": ("google.golang.org/grpc/cmd/protoc-gen-go-grpc", "v1.6.2"),
}
# What their `--version` answers (protoc-gen-go-grpc drops the v).
GO_PLUGIN_ANSWERS = {
    "protoc-gen-go": "protoc-gen-go v1.36.12",
    "protoc-gen-go-grpc": "protoc-gen-go-grpc 1.6.2",
}
# grpcio-tools' bundled protoc (grpcio-tools is pinned in pyproject.toml), which also generates
# the Python: the Go headers name its version ("protoc v7.35.1", protobuf's release number).
PROTOC = "libprotoc 35.1"
GO_TOOLS_DIR = Path.home() / ".cache" / "llmgw" / "tools" / "go" / "bin"
# The oldest Go that builds gen/go: its go.mod's `go` line (grpc-go 1.85 asks for 1.26.0).
GO_MIN = (1, 26)


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


def sources(protos: Path = PROTOS) -> list[str]:
    """The protos, relative to protos/ (or another tree's protos folder)."""
    return sorted(p.relative_to(protos).as_posix() for p in protos.rglob("*.proto"))


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


def protoc_version() -> str:
    """What grpcio-tools' protoc answers to --version (it prints to stdout itself)."""
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def go_plugins() -> dict[str, Path]:
    """The pinned Go plugins, from LLMGW_GO_TOOLS (or ~/.cache/llmgw/tools/go/bin): refused
    when missing or of another version than the pinned one."""
    folder = Path(os.environ.get("LLMGW_GO_TOOLS") or GO_TOOLS_DIR)
    found: dict[str, Path] = {}
    for tool, want in GO_PLUGIN_ANSWERS.items():
        path = folder / tool
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run `make go-tools` (go install, pinned)")
        got = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if got != want:
            raise SystemExit(f"{path} answers {got!r}; the committed Go code needs {want!r}")
        found[tool] = path
    got = protoc_version()
    if got != PROTOC:
        raise SystemExit(
            f"grpcio-tools' protoc answers {got!r}; the committed Go code needs {PROTOC!r}"
        )
    return found


def go_tool() -> str:
    """The machine's go (PATH, then /usr/local/go/bin/go), refused when missing or too old."""
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None
    )
    need = ".".join(map(str, GO_MIN))
    if found is None:
        raise SystemExit(
            f"go is not installed: gen/go needs Go {need} or newer (its go.mod; grpc-go 1.85"
            " requires it). Debian 12's golang-go is 1.19, too old: install Go from go.dev"
            " into /usr/local/go, or a Debian release whose golang-go is 1.26 or newer."
        )
    version = subprocess.run(
        [found, "env", "GOVERSION"], capture_output=True, text=True, check=False
    ).stdout.strip()
    numbers = re.match(r"go(\d+)\.(\d+)", version)
    if numbers is None or (int(numbers[1]), int(numbers[2])) < GO_MIN:
        raise SystemExit(f"{found} is {version or 'of no known version'}: gen/go needs Go {need}+")
    return found


def install_go_tools() -> None:
    """`go install` each pinned plugin into LLMGW_GO_TOOLS (~/.cache/llmgw/tools/go/bin) unless
    the pinned version is there already. The modules come through GOPROXY into GOMODCACHE, so
    a second run downloads nothing."""
    go = go_tool()
    folder = Path(os.environ.get("LLMGW_GO_TOOLS") or GO_TOOLS_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    for tool, (package, version) in GO_PLUGINS.items():
        path = folder / tool
        if path.is_file():
            got = subprocess.run(
                [str(path), "--version"], capture_output=True, text=True, check=False
            ).stdout.strip()
            if got == GO_PLUGIN_ANSWERS[tool]:
                continue
        print(f"go install {package}@{version}", file=sys.stderr)
        env = dict(os.environ, GOBIN=str(folder), GOFLAGS="-mod=mod")
        done = subprocess.run([go, "install", f"{package}@{version}"], env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"go install {package}@{version} failed")
    go_plugins()


def generate_go(out: Path) -> list[Path]:
    """Run grpcio-tools' protoc with protoc-gen-go and protoc-gen-go-grpc into `out`/gen/go."""
    plugins = go_plugins()
    go_out = out / GO_DIR
    go_out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTOS}",
        *(f"-I{inc}" for inc in includes()),
        *(f"--plugin={tool}={path}" for tool, path in plugins.items()),
        f"--go_out={go_out}",
        f"--go_opt=module={GO_MODULE}",
        f"--go-grpc_out={go_out}",
        f"--go-grpc_opt=module={GO_MODULE}",
        *sources(),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc (Go) failed")
    return sorted(p.relative_to(out) for p in go_out.rglob("*") if p.name.endswith(GO_SUFFIXES))


def write_descriptor_set(path: Path, protos: Path = PROTOS) -> None:
    """The protos and everything they import, with source info, as one FileDescriptorSet: the
    input `buf lint` and `buf generate` read offline (buf alone would fetch google/api from
    the Buf Schema Registry; here it comes from googleapis-common-protos). `protos` is another
    tree's protos folder for the baseline `buf breaking` compares against."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{protos}",
        *(f"-I{inc}" for inc in includes()),
        "--include_imports",
        "--include_source_info",
        f"--descriptor_set_out={path}",
        *sources(protos),
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
    parser.add_argument(
        "--protos", type=Path, default=PROTOS, help="the protos folder --descriptor-set reads"
    )
    parser.add_argument(
        "--go-tools", action="store_true", help="install the pinned Go plugins (make go-tools)"
    )
    opts = parser.parse_args()
    if opts.go_tools:
        install_go_tools()
        return 0
    if opts.descriptor_set is not None:
        write_descriptor_set(opts.descriptor_set.resolve(), opts.protos.resolve())
        return 0
    if opts.out is not None:
        out = opts.out.resolve()
        # Files of a removed proto must not linger in the Go tree.
        for stale in (out / GO_DIR).rglob("*"):
            if stale.name.endswith(GO_SUFFIXES):
                stale.unlink()
        generate_python(out)
        generate_go(out)
        (out / GO_SERVICE_CONFIG).write_bytes((ROOT / SERVICE_CONFIG).read_bytes())
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate_python(Path(tmp)) + generate_go(Path(tmp))
        drift = sorted(set(fresh) ^ set(committed()))
        drift += [
            p
            for p in fresh
            if (ROOT / p).exists() and not filecmp.cmp(Path(tmp) / p, ROOT / p, False)
        ]
        if (ROOT / GO_SERVICE_CONFIG).read_bytes() != (ROOT / SERVICE_CONFIG).read_bytes():
            drift.append(GO_SERVICE_CONFIG)
        if drift:
            for p in drift:
                print(f"generated code drifted from protos/: {p}", file=sys.stderr)
            print("run `make proto` and commit the result", file=sys.stderr)
            return 1
    print(f"generated code matches protos/ ({len(fresh)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
