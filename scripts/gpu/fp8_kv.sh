#!/usr/bin/env bash
# The FP8 K/V cache with Hadamard-rotated keys on CUDA.
#   fp8_kv.sh tests   the rotating writers' kernel tests (rope_kv_write, the
#                     QKV GEMV's RoPE epilogue) plain and under
#                     compute-sanitizer memcheck, and the whole model against
#                     the CPU with the same FP8 cache (calibrated scales: both
#                     rotate)
#   fp8_kv.sh ppl     SmolLM2-135M's perplexity (--score-all) on a held-out
#                     text TEXT (default /usr/share/common-licenses/GPL-3) on CUDA:
#                     BF16 weights with bf16 K/V, FP8 K/V at scale 1 and FP8
#                     K/V at the scales `lamina quantize --kv-scales`
#                     calibrates on tests/text/calibration.txt (rotated keys)
# Expects in devrun/: lamina, gpu_kernels, gpu_attention and model_tests
# (scripts/gpu/prepare.sh); ppl the GGUF at MODEL (default /tmp/smollm2.gguf;
# in parts through scripts/gpu/parts.sh when it is too large to send).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth LAMINA_HOME=${LAMINA_HOME:-/tmp/lamina-home}
log="$OUT/fp8_kv.log"
run() {
  local limit=$1; shift
  echo "=== $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "=== exit ${PIPESTATUS[0]}" | tee -a "$log"
}
case "${1:-}" in
  tests)
    run 150 ./devrun/gpu_attention --ignored --exact rope_kv_write_matches_reference
    run 150 ./devrun/gpu_kernels --ignored gemv_qkv_rope_matches_reference
    run 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
      ./devrun/gpu_attention --ignored --exact rope_kv_write_matches_reference
    run 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
      ./devrun/gpu_kernels --ignored gemv_qkv_rope_matches_reference
    run 200 ./devrun/model_tests --ignored --exact \
      cuda::tests::kv::cuda_fp8_kv_matches_the_cpu_with_fp8_kv --nocapture
    ;;
  ppl)
    L=./devrun/lamina M=${MODEL:-/tmp/smollm2.gguf} T=${TEXT:-/usr/share/common-licenses/GPL-3}
    cal=/tmp/smollm2-bf16-kv-scales
    run 300 $L quantize "$M" --out $cal --calibration tests/text/calibration.txt \
      --kv-scales --weight-dtype bf16
    for args in "--model $M --kv-cache-dtype auto" "--model $M --kv-cache-dtype fp8" \
                "--model $cal --kv-cache-dtype auto" "--model $cal --kv-cache-dtype fp8"; do
      echo "ppl cuda $args: $($L perplexity --device cuda --dtype bf16 --text "$T" --score-all \
        $args 2>&1 | tail -1)" | tee -a "$log"
    done
    ;;
  *) echo "usage: fp8_kv.sh tests | ppl" >&2; exit 2 ;;
esac
