#!/usr/bin/env bash
# Device side of a GPU run: on the lent H200 machine, from the folder scripts/gpu_prepare.sh
# filled (carried as .gpu), build the CUDA engine, write the synthetic 8B-shaped model,
# install Quanta from the carried wheels, run one benchmark, write its results under $OUT.
#
#   bash .gpu/gpu_run.sh BENCH [BENCH...]          # in the foreground, results in $OUT
#   bash .gpu/gpu_run.sh go SECONDS BENCH [BENCH...]
#
# `go` starts the benches detached (setsid: they outlive this call on the warm machine) unless
# benches started by a previous call still run, waits up to SECONDS for them to end, and copies
# what they have written so far into $OUT; a next call `go SECONDS` (no benches) on the
# still-warm machine waits again, and `go SECONDS BENCH...` once they are done starts more (with
# this call's carried code and environment: QUANTA_* settings, BENCH_ARGS). A call is at most 10
# minutes: the build and all benches take longer.
#
# BENCH: check     the environment only (GPU, nvcc, python), no build: a cheap first call
#        build     only build (libllama + llama-server, CUDA sm_90) and write the model
#        serve     raw llama_decode vs Quanta's served HTTP streaming at 1..256 streams
#        llama     llama-server vs Quanta: 200 at once x 256 tokens, interactive-vs-batch flood
#        long      real prompt lengths (2k to 16k): Quanta's defaults vs llama-server -np N,
#                  and llama-batched-bench's decode rate by KV layout
#        replay    the conversation trace at its recorded lengths: goodput vs llama-server
#        calibrate `quanta calibrate` on this machine (cost model), then two served runs (the
#                  crowd, a steady day) and the simulator's prediction of each
# Everything built stays in $WORK (default /tmp/quanta-gpu) so that later calls on the same warm
# machine skip the build; a fresh machine builds again (about 5 minutes on 16 cores).
# Environment: WORK, JOBS (default nproc), BUILD_TARGETS (default: llama mtmd llama-server;
# `serve` needs only llama), BENCH_ARGS (more `quanta bench gpu` flags). A carried
# quanta-before-src.tar.gz (gpu_prepare.sh with BEFORE) is served in turns with this tree.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${WORK:-/tmp/quanta-gpu}"
JOBS="${JOBS:-$(nproc)}"
OUT="${OUT:-$WORK/out}"
mkdir -p "$WORK" "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
SRC="$WORK/src"
BUILD="$SRC/vendor/llama.cpp/build"
SITE="$WORK/site"
MODEL="$WORK/synthetic-llama3-8b.Q4_0.gguf"

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

check() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true
    nvcc --version | tail -2
    "$PY" --version
    cmake --version | head -1
    nproc
    free -g | head -2
    df -h /tmp | tail -1
    ls /usr/local/cuda*/lib64/libcublas.so* /usr/local/cuda*/targets/*/lib/libcublas.so* \
        2>/dev/null | head -3 || true
    "$PY" -c 'import nvidia.cublas as m; print("pip cublas:", list(m.__path__))' || true
}

pip_cublas_flags() {  # a CUDA toolkit without cuBLAS: take the one torch's wheels carry
    local d
    d="$("$PY" -c 'import nvidia.cublas as m; print(list(m.__path__)[0])')"
    local lib="$d/lib"
    echo "-DCUDA_cublas_LIBRARY=$(ls "$lib"/libcublas.so* | head -1)" \
        "-DCUDA_cublasLt_LIBRARY=$(ls "$lib"/libcublasLt.so* | head -1)" \
        "-DCMAKE_CUDA_FLAGS=-I$d/include" "-DCMAKE_CXX_FLAGS=-I$d/include"
    export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
}

build() {
    if [[ -f "$WORK/.built" ]]; then
        return
    fi
    log "unpacking"
    rm -rf "$SRC" && mkdir -p "$SRC"
    tar -xJf "$HERE/llama-src.tar.xz" -C "$SRC"
    log "configure"
    # Shared libraries, laid out as llama-cpp-python's wheel has them (llama_cpp/lib/); no web
    # UI download (the machine reaches nothing), no tests or examples.
    local flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release
        -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
    if ! cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${flags[@]}" >"$WORK/cmake.log" 2>&1; then
        if grep -q "CUDA::cublas" "$WORK/cmake.log"; then
            log "no cuBLAS in the CUDA toolkit: using the pip one"
            rm -rf "$BUILD"
            # shellcheck disable=SC2046
            cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${flags[@]}" $(pip_cublas_flags) \
                >"$WORK/cmake.log" 2>&1 || { tail -40 "$WORK/cmake.log"; exit 1; }
            pip_cublas_flags >/dev/null
            echo "$LD_LIBRARY_PATH" >"$WORK/.ld_path"
        else
            tail -40 "$WORK/cmake.log"
            exit 1
        fi
    fi
    log "build ($JOBS jobs)"
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$JOBS" --target ${BUILD_TARGETS:-llama mtmd llama-server llama-batched-bench} \
        >"$WORK/build.log" 2>&1 ||
        { grep -m5 -B2 -A10 "error" "$WORK/build.log"; tail -20 "$WORK/build.log"; exit 1; }
    log "install"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$HERE"/whl/*.whl
    cp -r "$SRC/llama_cpp" "$SITE/"
    mkdir -p "$SITE/llama_cpp/lib"
    cp -P "$BUILD"/bin/*.so* "$SITE/llama_cpp/lib/"
    log "model"
    "$PY" "$HERE/make_synthetic_gguf.py" "$MODEL" --gguf-py "$SRC/vendor/llama.cpp/gguf-py"
    touch "$WORK/.built"
}

env_quanta() {
    # Quanta's source from this call's carry, every time: a later call on the warm machine
    # measures the code it brought, on the engine already built.
    rm -rf "$WORK/quanta" && mkdir -p "$WORK/quanta"
    tar -xzf "$HERE/quanta-src.tar.gz" -C "$WORK/quanta"
    if [[ -f "$WORK/.ld_path" ]]; then
        export LD_LIBRARY_PATH="$(cat "$WORK/.ld_path")"
    fi
    export PYTHONPATH="$WORK/quanta:$SITE" LD_LIBRARY_PATH="$SITE/llama_cpp/lib:${LD_LIBRARY_PATH:-}"
    # The code before a change, if carried: the serve bench runs its server in turns with
    # this tree's (app/lab/gpu.py, BENCH_BEFORE).
    rm -rf "$WORK/quanta-before"
    if [[ -f "$HERE/quanta-before-src.tar.gz" ]]; then
        mkdir -p "$WORK/quanta-before"
        tar -xzf "$HERE/quanta-before-src.tar.gz" -C "$WORK/quanta-before"
        export BENCH_BEFORE="$WORK/quanta-before:$SITE"
    fi
    export PATH="$SITE/bin:$PATH"
}

collect() {  # what the benches wrote, into this call's $OUT (at most 8 files come back)
    local dest="$1"
    tar -C "$WORK/out" -czf "$dest/results.tgz" . 2>/dev/null || true
    local n=0
    for f in "$WORK"/out/*.json; do
        [[ -f "$f" && $n -lt 6 ]] || continue
        case "$f" in *wl-*|*predict*) continue ;; esac
        cp "$f" "$dest/" && n=$((n + 1))
    done
    cp "$WORK/pipeline.log" "$dest/" 2>/dev/null || true
}

if [[ "${1:-}" == go ]]; then
    seconds="$2"
    shift 2
    CALL_OUT="$OUT"
    if [[ -f "$WORK/.done" && $# -gt 0 ]]; then
        rm -f "$WORK/.started" "$WORK/.done" "$WORK/.failed"  # the last ones ended: more
    fi
    if [[ ! -f "$WORK/.started" && $# -gt 0 ]]; then
        touch "$WORK/.started"
        log "pipeline: $*" 2>>"$WORK/pipeline.log"
        export WORK OUT="$WORK/out"
        # The benches run from a copy of this call's carry: a later call's carry replaces the
        # folder this script was started from.
        run_from="$WORK/carry-$(date +%s)"
        cp -r "$HERE" "$run_from"
        setsid nohup bash -c 'bash "$0" "$@" >>"$WORK/pipeline.log" 2>&1 || touch "$WORK/.failed"
            touch "$WORK/.done"' "$run_from/gpu_run.sh" "$@" </dev/null >/dev/null 2>&1 &
    fi
    deadline=$((SECONDS + seconds))
    while [[ ! -f "$WORK/.done" && $SECONDS -lt $deadline ]]; do
        sleep 5
    done
    collect "$CALL_OUT"
    tail -n 40 "$WORK/pipeline.log"
    if [[ -f "$WORK/.done" ]]; then
        echo "PIPELINE DONE$([[ -f "$WORK/.failed" ]] && echo ' (FAILED)')"
    else
        echo "PIPELINE STILL RUNNING"
    fi
    exit 0
fi

for bench in "$@"; do
    case "$bench" in
        check) check ;;
        build) build ;;
        serve | llama | long | replay | calibrate)
            build
            env_quanta
            log "bench $bench"
            # The carried source's command (PATH and PYTHONPATH from env_quanta).
            quanta bench gpu "$bench" --model "$MODEL" --out "$OUT" \
                --llama-server "$BUILD/bin/llama-server" ${BENCH_ARGS:-} ||
                log "bench $bench FAILED"  # the next bench still runs
            ;;
        *) echo "unknown bench: $bench" >&2; exit 2 ;;
    esac
done
