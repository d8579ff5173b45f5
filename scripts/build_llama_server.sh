#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the very llama.cpp source that the installed
# llama-cpp-python was built from (the llama.cpp vendored in its sdist), so that Quanta and
# llama-server can be measured with the same client, model and workload.
#
#   scripts/build_llama_server.sh            # prints the path of the built binary (last line)
#
# Environment:
#   PYTHON      the interpreter whose llama-cpp-python version is matched (default .venv/bin/python)
#   BUILD_DIR   where the sdist is unpacked and built (default ~/.cache/quanta/llama-server)
#   JOBS        parallel compile jobs (default: nproc)
#
# Re-running is cheap: the sdist is downloaded and unpacked once per version and cmake
# rebuilds only what changed. About 8–10 minutes on 2 cores the first time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
JOBS="${JOBS:-$(nproc)}"

VERSION="$("$PYTHON" -c 'from importlib.metadata import version; print(version("llama-cpp-python"))')"
BUILD_DIR="${BUILD_DIR:-$HOME/.cache/quanta/llama-server}/$VERSION"
mkdir -p "$BUILD_DIR"
echo "llama-cpp-python $VERSION → $BUILD_DIR" >&2

SDIST="$(ls "$BUILD_DIR"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
if [[ -z "$SDIST" ]]; then
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
        --dest "$BUILD_DIR" "llama-cpp-python==$VERSION" >&2
    SDIST="$(ls "$BUILD_DIR"/llama_cpp_python-"$VERSION".tar.gz)"
fi

SRC="$BUILD_DIR/llama_cpp_python-$VERSION"
if [[ ! -d "$SRC/vendor/llama.cpp" ]]; then
    tar -xzf "$SDIST" -C "$BUILD_DIR"
fi
LLAMA="$SRC/vendor/llama.cpp"

# Release build, CPU only, static libraries (the binary does not pick up another libllama),
# no libcurl (the model is a local file); built with the flags the Makefile gives Quanta's
# llama.cpp (no AMX path: see the Makefile), so both engines run the same kernels.
cmake -S "$LLAMA" -B "$LLAMA/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS=-U__AMX_INT8__ \
    -DCMAKE_CXX_FLAGS=-U__AMX_INT8__ \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$LLAMA/build" --target llama-server -j "$JOBS" >&2

BIN="$LLAMA/build/bin/llama-server"
test -x "$BIN"
"$BIN" --version >&2 || true
echo "$BIN"
