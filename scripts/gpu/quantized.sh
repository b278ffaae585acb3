#!/usr/bin/env bash
# GGUF blocks and int4 checkpoints on the GPU. PART=checks: the kernel
# tests of the block-format GEMVs and GEMM (`qgemm`) against their CPU
# references, CUDA vs the CPU backend on the same blocks and int4 weights,
# memcheck, and the 1B oracle (prompts of 7, 300 and 2,000 tokens, 64
# teacher-forced generated tokens) on an int4 checkpoint written by
# `lamina quantize --format int4` and on a Q4_K_M GGUF of the synthetic
# 1B (`scripts/synthetic-gguf.py`, then llama.cpp's `llama-quantize`),
# each against the float32 reference on its dequantised weights.
# PART=bench: `lamina bench` b1 / b2 / b3 on BF16, `--dtype q4_k`, `--dtype
# q8_0`, the int4 checkpoint and the Q4_K_M GGUF, with the transformers
# baseline, and llama.cpp with CUDA on the same GGUF (llama-bench
# alternating with lamina's b1 and b2; llama-batched-bench at 64
# sequences for decode at batch 64). Each part fits ten minutes.
# Expects devrun/ from scripts/gpu/prepare.sh, and for the GGUF steps
# LLAMACPP, a folder with llama.cpp's `llama-quantize` (any build, its
# shared libraries beside it: scripts/build-llama-bench.sh), `llama-bench`
# built with CUDA and, where it fits the transfer, `llama-batched-bench`
# (scripts/build-llama-cuda.sh); and PYDEPS, a folder holding the `gguf`
# Python package.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" quantized
part=${PART:-checks}
want() { [ "$part" = all ] || [ "$part" = "$1" ]; }
LLAMACPP=${LLAMACPP:-}
export PYTHONPATH=${PYDEPS:-}${PYTHONPATH:+:$PYTHONPATH}
M=$LAMINA_SYNTH_ROOT/llama-3.2-1b
M4=/tmp/lamina-llama-1b-int4
F16=/tmp/lamina-llama-1b-f16.gguf
QKM=/tmp/lamina-llama-1b-q4_k_m.gguf
[ -f "$M/model.safetensors" ] || step synth 120 ./devrun/lamina synth-model --preset llama-3.2-1b --seed 7 --out "$M" --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
[ -f "$M4/model.safetensors" ] || step quantize-int4 120 ./devrun/lamina quantize --format int4 "$M" --out "$M4"
if [ -n "$LLAMACPP" ] && [ ! -f "$QKM" ]; then
  step synth-gguf 180 python3 scripts/synthetic-gguf.py "$F16"
  step quantize-q4_k_m 120 env LD_LIBRARY_PATH="$LLAMACPP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$LLAMACPP/llama-quantize" "$F16" "$QKM" Q4_K_M 16
  rm -f "$F16"
fi
if want checks; then
step kernels 120 ./devrun/gpu_kernels --ignored --test-threads=1 qgemm gemv
step blocks_vs_cpu 150 $T --ignored --test-threads=1 cuda::tests::gguf_blocks cuda::tests::int4 cuda::gguf --nocapture
step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::gguf_blocks::cuda_gguf_blocks_match_the_cpu_on_the_same_blocks
step dump-int4 120 env LAMINA_CHECK_MODEL="$M4" LAMINA_CHECK_OUT=/tmp/lamina-dump-int4 $T --ignored --exact cuda::tests::llama::cuda_llama_1b_dump_for_oracle --nocapture
step oracle-int4 150 python3 "$here/compare_oracle.py" "$M4" /tmp/lamina-dump-int4 devrun
if [ -f "$QKM" ]; then
  # the GGUF imported into a store of its own, run on its blocks
  export LAMINA_HOME=/tmp/lamina-store
  step import-q4_k_m 120 ./devrun/lamina pull "$QKM"
  D=$(ls -d "$LAMINA_HOME"/models/* | head -1)
  step dump-q4_k_m 120 env LAMINA_CHECK_MODEL="$D" LAMINA_CHECK_OUT=/tmp/lamina-dump-qkm $T --ignored --exact cuda::tests::llama::cuda_llama_1b_dump_for_oracle --nocapture
  step oracle-q4_k_m 240 python3 "$here/compare_oracle.py" "$QKM" /tmp/lamina-dump-qkm devrun
  unset LAMINA_HOME
fi
fi
if want bench; then
B="./devrun/lamina bench --device cuda --kv-memory-gib 24"
step bench-bf16 90 $B --model "$M" --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_bf16.json"
step bench-q4_k 90 $B --model "$M" --dtype q4_k --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_q4_k.json"
step bench-q8_0 60 $B --model "$M" --dtype q8_0 --workloads ${BENCH:-b1} --json "$OUT/bench_q8_0.json"
step bench-int4 90 $B --model "$M4" --workloads ${BENCH:-b1,b2,b3} --json "$OUT/bench_int4.json"
if [ -f "$QKM" ]; then
  step bench-q4_k_m 180 $B --model "$QKM" --workloads b1,b2 --llama-bench "$LLAMACPP/llama-bench" --json "$OUT/bench_q4_k_m.json"
  step bench-q4_k_m-b64 90 $B --model "$QKM" --workloads b3 --b3-batch 64 --json "$OUT/bench_q4_k_m_b64.json"
  [ -x "$LLAMACPP/llama-batched-bench" ] && step llama-batched 120 "$LLAMACPP/llama-batched-bench" -m "$QKM" -ngl 99 -c 24576 -npp 128 -ntg 128 -npl 64
fi
step torch 150 python3 devrun/torch_baseline.py --model "$M" --workloads ${BENCH:-b1,b2,b3} --json "$OUT/torch.json"
fi
grep -E "^RESULT|^prompt |^64 gen|^case|test result|FAILED|panicked|ERROR SUMMARY|b1 |b2 |b3 |llama|S_TG|^\|" "$log" | tee "$OUT/summary.txt"
