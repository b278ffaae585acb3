#!/usr/bin/env bash
# One short GPU run after a merge: every kernel test, the 1B oracle
# comparison (7 / 300 / 2000 tokens + 64 teacher-forced), batch vs alone,
# SmolLM2 CUDA vs CPU, memcheck, then `lamina bench` and the transformers
# baseline in the same run. Ordered by priority: a run cut short keeps
# what came first. Expects devrun/ from scripts/gpu/prepare.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" final
export LAMINA_CHECK_OUT=/tmp/lamina-dump
step kernels 90 ./devrun/gpu_kernels --ignored --test-threads=1
step attention 120 ./devrun/gpu_attention --ignored --test-threads=1 --nocapture
step dump 60 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_dump_for_oracle --nocapture
step oracle 90 python3 "$here/compare_oracle.py" $LAMINA_SYNTH_ROOT/llama-3.2-1b $LAMINA_CHECK_OUT devrun
step batch1b 40 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_batch_matches_alone --nocapture
step smollm2 60 $T --ignored --exact cuda::tests::small::cuda_smollm2_matches_cpu --nocapture
step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_short_generation
M=$LAMINA_SYNTH_ROOT/llama-3.2-1b
step bench 90 ./devrun/lamina bench --device cuda --model $M --kv-memory-gib 24 --workloads ${BENCH:-b1,b2,b3} --json "$OUT/lamina_bench.json"
# the KV pool sized from free GPU memory (--gpu-memory-utilization 0.9): b3 must match the hand-sized pool's
step bench-default 90 ./devrun/lamina bench --device cuda --model $M --workloads b3 --json "$OUT/lamina_bench_default.json"
step startup 60 python3 "$here/startup.py" ./devrun/lamina --device cuda --model $M
step torch 150 python3 devrun/torch_baseline.py --model $M --workloads ${BENCH:-b1,b2,b3} --json "$OUT/torch.json"
grep -E "^RESULT|^prompt |^64 gen|^case|test result|FAILED|panicked|ERROR SUMMARY|b1 |b2 |b3 |TFLOP|KV pool" "$log" | tee "$OUT/summary.txt"
