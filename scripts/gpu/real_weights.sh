#!/usr/bin/env bash
# Real weights on the GPU: SmolLM2-135M-Instruct (the default model's Q4_1
# GGUF, tokenizer and chat template inside) at MODEL (default
# /tmp/smollm2.gguf). Perplexity on tests/text/lighthouses.txt for BF16,
# FP8 weights (W8A16, with the FP8 head, W8A8) and the FP8 K/V cache, then
# speculative decoding's `sp` workload (single stream, the repeated prompt,
# batch 64, the shipped chat prompts) for suffix and n-gram drafts.
# Expects devrun/ from scripts/gpu/prepare.sh; a GGUF too large to send in
# one piece travels in parts (scripts/gpu/parts.sh).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh" >/dev/null
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=./devrun/lamina
M=${MODEL:-/tmp/smollm2.gguf}
[ -f "$M" ] || { echo "no model at $M" >&2; exit 1; }
log="$OUT/real_weights.log"
for d in "bf16" "bf16 --kv-cache-dtype fp8" "fp8" "fp8 --kv-cache-dtype fp8" \
         "fp8 --fp8-activations" "fp8 --quantize-lm-head"; do
  echo "ppl --dtype $d: $($L perplexity --device cuda --model "$M" \
    --text tests/text/lighthouses.txt --score-all --dtype $d 2>&1 | tail -1)" | tee -a "$log"
done
for sp in ${SPEC:-suffix ngram}; do
  $L bench --device cuda --model "$M" --workloads b1,sp --speculative "$sp" \
    --num-speculative-tokens ${K:-4} --b3-batch 64 --repeats 3 \
    --json "$OUT/sp_$sp.json" 2>&1 | grep -E "^(b1|sp) " | tee -a "$log"
done
