#!/usr/bin/env python3
"""Teacher-forced log-probabilities of a Hugging Face model directory under
transformers in float32 (and under `llama_ref.py`, the numpy reference),
against `lamina perplexity --score-all` on the same text: the check of a
model family's forward pass on synthetic weights (`lamina synth-model
--preset gemma-3-270m`), on the CPU or on the GPU machine.

  transformers_check.py --lamina BIN --model DIR --text FILE [--ctx 600]
                        [--device cpu] [--layers N] [--limit 0.2]

The text is tokenized by `lamina tokenize --no-special` (the ids lamina
scores), cut into chunks of `--ctx` tokens as `--score-all` cuts them
(every token of a chunk after its first is scored, the last partial chunk
too), and each chunk runs from position 0. Printed: each engine's
perplexity, and the largest |difference| of a token's log-probability
between transformers and the numpy reference; exits 1 when lamina's mean
negative log-likelihood differs from transformers' by more than `--limit`
(or the reference's tokens by more than `--limit`). `--layers N` keeps
the first N layers of the checkpoint (a copy in a temporary directory),
for speed. Needs torch and transformers (`PYTHONPATH` to them) and numpy.
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def truncated(model: Path, layers: int, out: Path) -> Path:
    """A copy of `model` with only its first `layers` layers."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((model / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:layers]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    keep = {}
    for f in sorted(model.glob("*.safetensors")):
        for name, t in load_file(f).items():
            parts = name.split(".")
            if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= layers:
                continue
            keep[name] = t
    save_file(keep, str(out / "model.safetensors"))
    for f in model.iterdir():
        if f.suffix == ".json" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out


def log_probs(logits: np.ndarray, seq: list[int]) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    return np.array([x[i, seq[i + 1]] - lse[i] for i in range(len(seq) - 1)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lamina", required=True)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=600)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--limit", type=float, default=0.2)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    model = truncated(args.model, args.layers, Path(tmp.name)) if args.layers else args.model

    text = Path(args.text).read_text()
    ids = [int(t) for t in run([args.lamina, "tokenize", "--model", str(model), "--no-special", text]).replace(",", " ").split()]
    chunks = [ids[i : i + args.ctx] for i in range(0, len(ids), args.ctx)]
    chunks = [c for c in chunks if len(c) >= 2]

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent))
    import llama_ref

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32, attn_implementation="eager").eval()
    ref = llama_ref.Model.load(model)
    tf_lp, ref_lp = [], []
    with torch.no_grad():
        for c in chunks:
            logits = hf(torch.tensor([c])).logits[0].numpy()
            tf_lp.append(log_probs(logits, c))
            ref_lp.append(log_probs(ref.logits(c), c))
    tf_lp, ref_lp = np.concatenate(tf_lp), np.concatenate(ref_lp)
    ours = json.loads(
        run([args.lamina, "perplexity", "--model", str(model), "--device", args.device, "--text", args.text,
             "-c", str(args.ctx), "--score-all", "--json", "--kv-cache-dtype", "f32"])
    )
    assert ours["tokens_scored"] == len(tf_lp), (ours, len(tf_lp))
    nll = {"transformers": -tf_lp.mean(), "reference": -ref_lp.mean(), "lamina": math.log(ours["perplexity"])}
    for k, v in nll.items():
        print(f"{k:12} perplexity {math.exp(v):.5f}  mean nll {v:.6f}")
    token_diff = float(np.abs(tf_lp - ref_lp).max())
    mean_diff = abs(nll["lamina"] - nll["transformers"])
    print(f"{len(tf_lp)} tokens in {len(chunks)} chunks of up to {args.ctx}")
    print(f"max |dlogp| transformers vs reference: {token_diff:.2e}")
    print(f"|mean nll| lamina vs transformers: {mean_diff:.2e}")
    sys.exit(0 if token_diff <= args.limit and mean_diff <= args.limit else 1)


if __name__ == "__main__":
    main()
