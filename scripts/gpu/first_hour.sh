#!/usr/bin/env bash
# The first hour on a GPU: time to first token of the first requests after
# start, without the start-up warm-up (`--warmup-secs 0`) and with the
# default, on the synthetic 1B (scripts/gpu/first_requests.py); then the
# whole-model checks a merge must keep (SmolLM2-shaped CUDA vs CPU, the
# short generation under memcheck) and the processor the CPU paths ran on.
# Expects devrun/ from scripts/gpu/prepare.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" first_hour
L=./devrun/lamina
M=$LAMINA_SYNTH_ROOT/llama-3.2-1b
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$log"
grep -m1 "model name" /proc/cpuinfo | tee -a "$log"
echo "cpu flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')" | tee -a "$log"
step synth 120 $L synth-model --preset llama-3.2-1b --seed 0 --out $M \
  --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
step cold 150 python3 "$here/first_requests.py" $L --device cuda --model $M --kv-memory-gib 16 --warmup-secs 0
step warm 150 python3 "$here/first_requests.py" $L --device cuda --model $M --kv-memory-gib 16
step smollm2 60 $T --ignored --exact cuda::tests::small::cuda_smollm2_matches_cpu --nocapture
step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_short_generation
grep -E "^RESULT|^round|warmed|started in|test result|FAILED|panicked|ERROR SUMMARY|^STEP" "$log" | tee "$OUT/summary.txt"
