#!/usr/bin/env bash
# The kernel tests (each kernel vs its CPU reference).
# Expects devrun/gpu_kernels and devrun/gpu_attention (the release test
# binaries of crates/kernels, `cargo test -p kernels --release --no-run`,
# copied and stripped).
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
./devrun/gpu_kernels --ignored --test-threads=1 2>&1 | tee "$OUT/kernels.log"
k=${PIPESTATUS[0]}
./devrun/gpu_attention --ignored --test-threads=1 2>&1 | tee -a "$OUT/kernels.log"
echo "kernel tests exit: $k, attention tests exit: ${PIPESTATUS[0]}"
