#!/usr/bin/env bash
# FP8 weights on the GPU (W8A16): the kernel tests (FP8 GEMVs beside the
# bf16 ones), FP8 CUDA vs the CPU on the dequantised weights (SmolLM2
# preset), the 1B oracle on an FP8 checkpoint written by `lamina quantize`
# (compressed-tensors, per channel) against the float32 reference on its
# dequantised weights, memcheck; the FP8 K/V cache (`--kv-cache-dtype fp8`):
# the K/V kernels' e4m3 writes and reads against `ops::kv`, CUDA FP8 KV
# against the CPU's FP8 KV, verify rows over it, memcheck; then `lamina
# bench` bf16, FP8 (W8A16), FP8 with FP8 activations in the GEMMs (W8A8,
# `--fp8-activations`: b2, b3), the FP8 K/V cache with bf16 and with FP8
# weights, with the transformers baseline in the same run (PART=checks or
# PART=bench runs one half, each within ten minutes). Expects devrun/ from
# scripts/gpu/prepare.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" fp8
part=${PART:-all}
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
M=$LAMINA_SYNTH_ROOT/llama-3.2-1b
M8=/tmp/lamina-llama-1b-fp8
[ -f "$M/model.safetensors" ] || step synth 120 ./devrun/lamina synth-model --preset llama-3.2-1b --seed 7 --out "$M" --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
[ -f "$M8/model.safetensors" ] || step quantize 120 ./devrun/lamina quantize "$M" --out "$M8"
if want checks; then
step kernels 120 ./devrun/gpu_kernels --ignored --test-threads=1
step fp8_gemm 60 ./devrun/fp8_gemm --ignored --test-threads=1
step fp8_vs_cpu 120 $T --ignored --test-threads=1 cuda::tests::fp8 --nocapture
step dump8 90 env LAMINA_CHECK_MODEL="$M8" LAMINA_CHECK_OUT=/tmp/lamina-dump8 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_dump_for_oracle --nocapture
step oracle8 120 python3 "$here/compare_oracle.py" "$M8" /tmp/lamina-dump8 devrun
step memcheck8 90 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::fp8::cuda_fp8_short_generation
A=./devrun/gpu_attention
step kv8_kernels 180 $A --ignored --test-threads=1 rope_kv_write prefill_attention_matches decode_attention_matches flash_fp8_cache
step kv8_gemv 60 ./devrun/gpu_kernels --ignored --test-threads=1 gemv_qkv_rope
step kv8_vs_cpu 150 $T --ignored --test-threads=1 cuda::tests::kv --nocapture
step kv8_spec 90 $T --ignored --exact cuda::tests::spec::cuda_verify_rows_with_fp8_kv_sample_what_plain_decoding_samples
step memcheck_kv8 120 compute-sanitizer --tool memcheck --error-exitcode 9 $A --ignored --test-threads=1 flash_fp8_cache rope_kv_write
fi
if want bench; then
step bench_bf16 90 ./devrun/lamina bench --device cuda --model "$M" --kv-memory-gib 24 --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_bf16.json"
step bench_fp8 90 ./devrun/lamina bench --device cuda --model "$M8" --kv-memory-gib 24 --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_fp8.json"
step bench_kv8 90 ./devrun/lamina bench --device cuda --model "$M" --kv-cache-dtype fp8 --kv-memory-gib 24 --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_kv8.json"
step bench_fp8_kv8 90 ./devrun/lamina bench --device cuda --model "$M8" --kv-cache-dtype fp8 --kv-memory-gib 24 --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_fp8_kv8.json"
step bench_w8a8 90 ./devrun/lamina bench --device cuda --model "$M8" --fp8-activations --kv-memory-gib 24 --workloads ${BENCH:-b2,b3} --json "$OUT/bench_w8a8.json"
step torch 150 python3 devrun/torch_baseline.py --model "$M" --workloads ${BENCH:-b1,b2,b3} --json "$OUT/torch.json"
fi
grep -E "^RESULT|^prompt |^64 gen|^case|test result|FAILED|panicked|ERROR SUMMARY|b1 |b2 |b3 " "$log" | tee "$OUT/summary.txt"
