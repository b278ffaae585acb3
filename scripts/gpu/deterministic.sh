#!/usr/bin/env bash
# Deterministic mode on the GPU. PART=checks: the batch-invariant GEMM's
# kernel tests (both forms against ops::linear, every row bit for bit the
# same alone and in any batch) and memcheck, its timings against cuBLAS,
# the whole-model checks (`cuda::tests::det`, under each product choice),
# and `deterministic.py` (200 completions under load, every answer equal
# to the lone run's). PART=bench: `lamina
# bench` b1 and b3 in the default mode and with `--deterministic` for each
# product choice (auto, cublaslt, own), two rounds alternating, with
# transformers + torch.compile b1 in the same run; the start-up log says
# which shapes each choice pinned where. Expects devrun/ from
# scripts/gpu/prepare.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" deterministic
part=${PART:-all}
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
M=$LAMINA_SYNTH_ROOT/llama-3.2-1b
[ -f "$M/model.safetensors" ] || step synth 120 ./devrun/lamina synth-model --preset llama-3.2-1b --seed 7 --out "$M" --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
if want checks; then
step inv_kernels 180 ./devrun/gpu_kernels --ignored --test-threads=1 invariant_gemm
step inv_memcheck 180 compute-sanitizer --tool memcheck --error-exitcode 9 ./devrun/gpu_kernels --ignored --test-threads=1 invariant_gemm
step inv_timings 180 ./devrun/kernel_timings invariant
step det_tests 400 $T --ignored --test-threads=1 cuda::tests::det --nocapture
step det_http 400 python3 "$here/deterministic.py" ./devrun/lamina "$M"
fi
if want bench; then
b() { step "$1" 120 env RUST_LOG=warn,model=info ./devrun/lamina bench --device cuda --model "$M" --kv-memory-gib 24 --workloads ${BENCH:-b1,b3} --json "$OUT/$1.json" "${@:2}"; }
for round in 1 2; do
  b "default_$round"
  for g in auto cublaslt own; do
    b "det_${g}_$round" --deterministic --deterministic-gemm "$g"
  done
done
grep -h "deterministic GEMM" "$log" | sort | uniq -c > "$OUT/det_picks.txt"
step torch 150 python3 devrun/torch_baseline.py --model "$M" --workloads b1 --json "$OUT/torch.json"
fi
grep -E "^RESULT|test result|FAILED|panicked|ERROR SUMMARY|b1 |b3 |differ" "$log" | tee "$OUT/summary.txt"
