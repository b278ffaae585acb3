#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` (and `llama-quantize`, which makes a BF16
# GGUF from the store's Q4_1 download, and `llama-perplexity`, the reference for
# `lamina perplexity`) from the pinned llama-cpp-python sdist, for
# `lamina bench --device cpu --llama-bench PATH` (the side-by-side
# comparison). CPU only, tuned for this machine (-DGGML_NATIVE=ON; NATIVE=0 below).
#
# Usage: scripts/build-llama-bench.sh [OUT_DIR]   (default .cache/llama-bench)
#   JOBS=N    parallel compile jobs (default: all cores; about 10 minutes on 2)
#   NATIVE=0  no -march=native: AVX2 and AVX-512 (F, VBMI, VNNI, BF16) but no AMX,
#             for machines whose native build dies with SIGILL (AMX listed by the
#             CPU but not enabled for the process); builds into OUT_DIR/build-portable
# Prints the path of the built binary on its last line.
# Needs: python3 with pip, a C/C++ compiler; cmake comes from PyPI (pinned).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/llama-source.sh"
OUT="${1:-$ROOT/.cache/llama-bench}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUILD="$OUT/build"
ARCH=(-DGGML_NATIVE=ON)
if [[ "${NATIVE:-1}" == 0 ]]; then
    BUILD="$OUT/build-portable"
    ARCH=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
          -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
          -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
BIN="$BUILD/bin/llama-bench"
if [[ -x "$BIN" && -x "$BUILD/bin/llama-quantize" && -x "$BUILD/bin/llama-perplexity" ]]; then
    echo "$BIN"
    exit 0
fi

llama_source "$OUT"

"$OUT/venv/bin/cmake" -S "$SRC" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release "${ARCH[@]}" -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >"$OUT/cmake.log" 2>&1
"$OUT/venv/bin/cmake" --build "$BUILD" --target llama-bench llama-quantize llama-perplexity -j "$JOBS" >"$OUT/build.log" 2>&1
echo "$BIN"
