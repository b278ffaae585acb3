#!/usr/bin/env bash
# `lamina serve` on the GPU and a `lamina bench-serve` rate sweep
# against it over HTTP (loopback), then the latency-against-throughput plot.
# Expects devrun/lamina (scripts/gpu/prepare.sh).
# Usage: scripts/gpu/serve_sweep.sh MODEL_DIR [RATES] [NUM_PROMPTS]
#   RATES: comma-separated requests/s (default 8,16,32,64,128,inf)
#   Writes $OUT/serve_sweep.{txt,json,svg} and $OUT/serve.log.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=./devrun/lamina
M=${1:?model directory}
RATES=${2:-8,16,32,64,128,inf}
N=${3:-200}
PORT=${PORT:-8000}
$L serve --model "$M" --device cuda --kv-memory-gib 24 --port "$PORT" > "$OUT/serve.log" 2>&1 &
SP=$!
trap 'kill $SP 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
$L bench-serve --url "http://127.0.0.1:$PORT" --num-prompts "$N" --request-rate "$RATES" \
  --input-len 256:1024 --output-len 64:256 --warmup 64 --json "$OUT/serve_sweep.json" \
  > "$OUT/serve_sweep.txt" 2>&1
echo "bench-serve exit $?"
python3 "$here/serve_plot.py" "$OUT/serve_sweep.json" "$OUT/serve_sweep.svg" || true
