#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` (and `llama-quantize`, which makes a BF16
# GGUF from the store's Q4_1 download) from the pinned llama-cpp-python sdist, for
# `lamina bench --device cpu --llama-bench PATH` (the side-by-side
# comparison). CPU only, tuned for this machine (-DGGML_NATIVE=ON).
#
# Usage: scripts/build-llama-bench.sh [OUT_DIR]   (default .cache/llama-bench)
#   JOBS=N    parallel compile jobs (default: all cores; about 10 minutes on 2)
# Prints the path of the built binary on its last line.
# Needs: python3 with pip, a C/C++ compiler; cmake comes from PyPI (pinned).
set -euo pipefail

VERSION=0.3.36      # llama-cpp-python sdist, pins llama.cpp (commit 0c1e570)
CMAKE_VERSION=3.31.6
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/.cache/llama-bench}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$OUT/build/bin/llama-bench"
if [[ -x "$BIN" && -x "$OUT/build/bin/llama-quantize" ]]; then
    echo "$BIN"
    exit 0
fi

# cmake from PyPI into a private venv (no system packages touched)
if [[ ! -x "$OUT/venv/bin/cmake" ]]; then
    python3 -m venv "$OUT/venv"
    "$OUT/venv/bin/pip" install --quiet "cmake==$CMAKE_VERSION"
fi

SRC="$OUT/llama_cpp_python-$VERSION"
if [[ ! -d "$SRC" ]]; then
    "$OUT/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python \
        --dest "$OUT" "llama-cpp-python==$VERSION"
    tar -xzf "$OUT/llama_cpp_python-$VERSION.tar.gz" -C "$OUT"
fi

"$OUT/venv/bin/cmake" -S "$SRC/vendor/llama.cpp" -B "$OUT/build" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >"$OUT/cmake.log" 2>&1
"$OUT/venv/bin/cmake" --build "$OUT/build" --target llama-bench llama-quantize -j "$JOBS" >"$OUT/build.log" 2>&1
echo "$BIN"
