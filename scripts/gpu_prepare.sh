#!/usr/bin/env bash
# Host side of a GPU run: prepare everything the lent GPU machine needs, in one ignored folder
# that the device call carries (it can download nothing; at most 64 MiB travel).
#
#   scripts/gpu_prepare.sh [DEST]        # DEST default: <checkout>/.gpu
#
# DEST gets:
#   llama-src.tar.xz   llama-cpp-python's Python package and its vendored llama.cpp, trimmed to
#                      what a CUDA + CPU build of libllama and llama-server needs
#   whl/               a wheel of Quanta built from this tree, and the wheels of its
#                      dependencies that the machine's image lacks (CPython 3.12, x86-64)
#   quanta-src.tar.gz  this tree's source (uncommitted edits included)
#   quanta-before-src.tar.gz   the source at commit BEFORE (unset: none), which the serve
#                      bench runs in turns with this tree's (BENCH_BEFORE on the device)
#   gpu_run.sh, make_synthetic_gguf.py   the device-side scripts (the benches themselves are
#                      `quanta bench gpu`, in the source above)
# and DEST is added to the checkout's .git/info/exclude. Then, on the device:
#   run(command="bash .gpu/gpu_run.sh go 565 build serve llama calibrate", carry=[".gpu"])
#   (then `go 565` again at once: bench/results/gpu/README.md)
#
# Environment: PYTHON (default: the checkout's .venv/bin/python, else /work/main/.venv), SDIST
# (a llama_cpp_python-<version>.tar.gz already downloaded; default: downloaded through pip),
# BEFORE (a commit: its server code is measured beside this tree's; unset: not).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$(realpath -m "${1:-$ROOT/.gpu}")"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=/work/main/.venv/bin/python
VERSION="$("$PYTHON" -c 'from importlib.metadata import version; print(version("llama-cpp-python"))')"
WORK="$(mktemp -d -t quanta-gpu-prepare-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

rm -rf "$DEST"
mkdir -p "$DEST/whl"
# Ignore DEST in the git checkout it lives in (it is carried, never committed).
GIT_DIR="$(git -C "$(dirname "$DEST")" rev-parse --absolute-git-dir 2>/dev/null || true)"
if [[ -n "$GIT_DIR" ]]; then
    TOP="$(git -C "$(dirname "$DEST")" rev-parse --show-toplevel)"
    REL="/${DEST#"$TOP"/}/"
    mkdir -p "$GIT_DIR/info"
    grep -qxF "$REL" "$GIT_DIR/info/exclude" 2>/dev/null || echo "$REL" >>"$GIT_DIR/info/exclude"
fi

# 1. The trimmed source: the Python package, and llama.cpp without its models, docs, tests,
#    examples, web UI sources and the GPU backends other than CUDA.
SDIST="${SDIST:-}"
if [[ -z "$SDIST" ]]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: -d "$WORK" \
        "llama-cpp-python==$VERSION"
    SDIST="$WORK/llama_cpp_python-$VERSION.tar.gz"
fi
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION"
L="$SRC/vendor/llama.cpp"
rm -rf "$L"/{models,docs,tests,benches,examples,pocs,media,conversion,app,ci,skills} \
    "$L"/.github "$L"/.devops
find "$L/gguf-py" -name tests -type d -prune -exec rm -rf {} +
for backend in "$L"/ggml/src/ggml-*/; do
    case "$(basename "$backend")" in
        ggml-cuda | ggml-cpu) ;;
        *) rm -rf "$backend" ;;
    esac
done
# The server's web UI: keep only what its CMake step needs to embed an empty UI.
find "$L/tools/ui" -mindepth 1 -maxdepth 1 \
    ! -name CMakeLists.txt ! -name '*.in' ! -name sources.cmake -exec rm -rf {} +
# CMake still names these folders; empty ones keep configure happy with them switched off.
mkdir -p "$L"/{tests,examples,pocs,app}
touch "$L"/{tests,examples,pocs,app}/CMakeLists.txt
tar -C "$SRC" -cJf "$DEST/llama-src.tar.xz" llama_cpp vendor/llama.cpp

# 2. Wheels: Quanta from this tree, and what the device image lacks (its package list:
#    the device library's KINDS.md). Versions are the ones this venv runs.
"$PYTHON" -m pip wheel --quiet --no-deps -w "$DEST/whl" "$ROOT"
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
MISSING="aiosqlite alembic annotated-types asyncpg diskcache faker greenlet httptools litestar
litestar-htmx mako msgspec multipart polyfactory pydantic pydantic-core pydantic-settings
python-dotenv rich-click sniffio sqlalchemy typing-inspection tzdata uvicorn platformdirs
swagger-ui-py"
PINS=()
for name in $MISSING; do
    PINS+=("$name==$("$PYTHON" -c "from importlib.metadata import version; print(version('$name'))")")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST/whl" "${PINS[@]}"

# The source tree too: the wheel holds the packages only, and `quanta migrate` reads
# alembic.ini and migrations/ beside them (app/db/migrate.py); on the device it goes first on
# PYTHONPATH. The working tree's files, uncommitted edits included.
git -C "$ROOT" ls-files -co --exclude-standard -- app quanta_core migrations alembic.ini \
    pyproject.toml scripts config bench/workloads bench/traces |
    tar -C "$ROOT" -czf "$DEST/quanta-src.tar.gz" -T -
if [[ -n "${BEFORE:-}" ]]; then
    git -C "$ROOT" archive --format=tar.gz -o "$DEST/quanta-before-src.tar.gz" "$BEFORE" -- \
        app quanta_core migrations config alembic.ini pyproject.toml
fi

# 3. The device-side scripts.
cp "$ROOT"/scripts/{gpu_run.sh,make_synthetic_gguf.py} "$DEST/"
du -sh "$DEST" "$DEST"/* >&2
