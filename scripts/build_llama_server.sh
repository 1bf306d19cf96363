#!/usr/bin/env bash
# Build llama.cpp once, CPU only, from the llama.cpp that the llama-cpp-python source
# distribution vendors (the llama.cpp the planner's rules are read from), into a cache folder
# outside the repo, ~/.cache/llmgw/llama.cpp:
#   bin/llama-server   the server the agent runs (its find_llama_server and `llmgw up` look here)
#   lib/lib*.so        libllama and libggml*, which llama-server links and the tests' oracle
#                      loads through ctypes: one build serves both
#   python/llama_cpp/  the sdist's ctypes bindings (Python files only, nothing compiled), which
#                      the oracle imports with LLAMA_CPP_LIB_PATH pointing at lib/
# llama-cpp-python itself is never pip-installed, so its own copy of llama.cpp is never built.
#
# Idempotent: a stamp records the llama-cpp-python version and the CMake flags the binary was
# built with; when both match and the binary runs, nothing is done. Change either and it
# rebuilds. An interrupted build resumes where it stopped (the work folder is kept until the
# binary is installed). Needs cmake, a C++17 compiler and PyPI (pip download) the first time.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  the sdist to build from (default: the pin below)
#   PYTHON                    the interpreter whose pip downloads the sdist (default .venv's)
#   CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default 2)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[llama-server] %s\n' "$*" >&2; }

# The pin: the llama.cpp whose rules planner_svc models (LLAMACPP_VERSION says which commit).
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

cache="$HOME/.cache/llmgw/llama.cpp"
bin="$cache/bin/llama-server"
stamp="$cache/stamp"
python="${PYTHON:-$repo_root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

# Portable CPU build of llama-server and the shared libraries. Why each flag:
# - GGML_NATIVE=OFF: no -march=native, so the binary runs on any x86-64 with AVX2 (ggml's
#   default instruction set when not native), not only on the machine that built it.
# - BUILD_SHARED_LIBS=ON: libllama.so and libggml*.so, shared by llama-server and the oracle;
#   the RPATH ($ORIGIN and $ORIGIN/../lib) lets llama-server find them in the build folder and
#   in the cache without LD_LIBRARY_PATH.
# - LLAMA_OPENSSL=OFF: the agent serves local files and plain-HTTP URLs; no libssl needed.
#   (LLAMA_CURL is gone from this llama.cpp: it only warns, so it is not passed.)
# - LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF: the web UI would be built with npm or
#   downloaded from Hugging Face at build time; the server works without it.
# - no tests, examples or the unified app; only the llama-server target (and the libraries
#   it links) is built.
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=OFF
    -DGGML_CUDA=OFF
    -DBUILD_SHARED_LIBS=ON
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN:\$ORIGIN/../lib"
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
)
want_stamp="llama-cpp-python==$version cmake ${cmake_flags[*]}"

up_to_date() {
    [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] \
        && [[ -f "$cache/lib/libllama.so" && -f "$cache/python/llama_cpp/llama_cpp.py" ]] \
        && "$bin" --version >/dev/null 2>&1
}

if up_to_date; then
    log "up to date: $bin (llama-cpp-python $version)"
    exit 0
fi

mkdir -p "$cache"
# One build at a time: a second `make llama-server` waits, then finds the binary built.
exec 9>"$cache/.lock"
if ! flock -n 9; then
    log "another build holds $cache/.lock; waiting for it"
    flock 9
fi
if up_to_date; then
    log "up to date: $bin (llama-cpp-python $version)"
    exit 0
fi

command -v cmake >/dev/null || { log "cmake is not installed (apt-get install cmake)"; exit 1; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

started=$SECONDS
# The work folder is per version: what an interrupted build of this version left is reused.
work="$cache/work"
if [[ "$(cat "$work/version" 2>/dev/null)" != "$version" ]]; then
    rm -rf "$work"
    mkdir -p "$work"
    printf '%s\n' "$version" >"$work/version"
fi

sdist="$work/llama_cpp_python-$version.tar.gz"
if [[ ! -f "$sdist" ]]; then
    log "downloading the llama-cpp-python $version source distribution"
    "$python" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work"
fi
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
if [[ ! -f "$work/unpacked" ]]; then
    log "unpacking $(basename "$sdist")"
    rm -rf "$work/llama_cpp_python-$version"
    tar -xzf "$sdist" -C "$work"
    touch "$work/unpacked"
fi
[[ -f "$src/CMakeLists.txt" ]] || { log "no vendor/llama.cpp in $sdist"; exit 1; }

log "configuring (${cmake_flags[*]})"
cmake -S "$src" -B "$work/build" "${generator[@]}" "${cmake_flags[@]}" >"$work/configure.log" 2>&1 \
    || { tail -n 40 "$work/configure.log" >&2; log "configure failed: $work/configure.log"; exit 1; }

log "compiling llama-server and libllama with $jobs jobs (about ten minutes on 2 cores)"
cmake --build "$work/build" --target llama-server -j "$jobs"

built="$work/build/bin/llama-server"
"$built" --version >/dev/null 2>&1 || { log "the built $built does not run"; exit 1; }
# Stage the whole install beside the cache, then swap it in, so an agent or a test never
# finds half of it: bin/, lib/ (every shared library the build made) and python/llama_cpp/.
stage="$cache/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/python"
cp "$built" "$stage/bin/"
find "$work/build" -name 'lib*.so*' -exec cp -P {} "$stage/lib/" \;
[[ -f "$stage/lib/libllama.so" ]] || { log "the build made no libllama.so"; exit 1; }
cp -r "$work/llama_cpp_python-$version/llama_cpp" "$stage/python/llama_cpp"
find "$stage/python" -name '*.so' -delete
"$stage/bin/llama-server" --version >/dev/null 2>&1 \
    || { log "the staged llama-server does not find its libraries"; exit 1; }
rm -rf "$cache/bin" "$cache/lib" "$cache/python"
mv "$stage/bin" "$stage/lib" "$stage/python" "$cache/"
rmdir "$stage"
printf '%s\n' "$want_stamp" >"$stamp"
rm -rf "$work"

log "built $bin in $((SECONDS - started)) s"
"$bin" --version 2>&1 | sed 's/^/[llama-server]   /' >&2
