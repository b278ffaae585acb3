#!/usr/bin/env python3
"""The figures and the table of scripts/gpu/families.sh.

  families_report.py floor NAME MODEL_DIR BENCH_JSON BANDWIDTH_GB_S
      b1 decode of `lamina bench --json` against its floor: the bytes a
      decode step reads (every tensor of model.safetensors, from its
      header, but the embedding table when an LM head of its own is read
      instead; plus the K/V of b1's mean context) at the run's
      device-to-device copy bandwidth. Prints one RESULT line.
  families_report.py table LOG
      One row per model from the RESULT and STEP lines of LOG (the latest
      of each wins).
"""
import json
import os
import re
import struct
import sys


def weight_bytes(model_dir):
    """Bytes of the tensors a decode step reads (BF16 as stored)."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
    total = sum(sizes.values())
    if "lm_head.weight" in sizes:  # untied: the embedding is gathered a row at a time
        total -= sum(v for k, v in sizes.items() if k.endswith("embed_tokens.weight"))
    return total


def kv_bytes(cfg, ctx):
    """K and V (bf16) of `ctx` tokens, the windowed layers capped at their window."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["full_attention"] * layers
    win = cfg.get("sliding_window") or ctx
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = cfg["num_key_value_heads"] * d * 2 * 2
    return sum(per_token * (min(ctx, win) if t == "sliding_attention" else ctx) for t in types[:layers])


def floor(name, model_dir, bench_json, bw):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    try:
        r = json.load(open(bench_json))
    except Exception as e:  # the bench step failed: say so in the table
        print(f"RESULT b1 {name}: no result ({e})")
        return
    z = r.get("sizes", r.get("workloads", {}))
    prompt, gen = z.get("b1_prompt", 128), z.get("b1_gen", 256)
    step = weight_bytes(model_dir) + kv_bytes(cfg, prompt + gen // 2)
    fl = float(bw) * 1e9 / step
    tok, b3 = r.get("b1_decode_tok_s"), r.get("b3_out_tok_s")
    if tok is None:
        print(f"RESULT b1 {name}: result file has {sorted(r)}")
        return
    print(f"RESULT b1 {name} {tok:.1f} tok/s, floor {fl:.0f} tok/s ({step / 1e9:.3f} GB a step), "
          f"{100 * tok / fl:.1f}% of the floor; b3 {b3 or 0:.0f} tok/s")


PATTERNS = {
    "step": r"^STEP (\S+) exit (\d+) \((\d+) s\)",
    "batch": r"^RESULT (\S+) batch-vs-alone worst rel err (\S+)",
    "hf": r"^RESULT hf (\S+) (\S+) max\|dlogp\| (\S+) rel (\S+) argmax= (\S+) (ok|FAIL)",
    "greedy": r"^RESULT (\S+) greedy tokens = argmax of their teacher-forced rows: (\d+)/(\d+)",
    "graphs": r"^RESULT (\S+) decode graphs captured: (\d+); eager decode equals graph replay: (\w+)",
    "memcheck": r"^RESULT memcheck (\S+): .*?(ERROR SUMMARY: \d+ errors?|no ERROR SUMMARY)",
    "b1": r"^RESULT b1 (\S+) (\S+) tok/s, floor (\S+) tok/s \((\S+) GB a step\), (\S+)% of the floor; b3 (\S+) tok/s",
}


def table(log):
    got = {k: {} for k in PATTERNS}
    for line in open(log, errors="replace"):
        for k, p in PATTERNS.items():
            m = re.match(p, line)
            if m:
                g = m.groups()
                key = (g[0], g[1]) if k == "hf" else g[0]
                got[k][key] = g
    steps = got["step"]
    names = []
    for k in ("batch", "greedy", "b1", "memcheck"):
        names += [n for n in got[k] if n not in names]
    names += sorted({p for p, _ in got["hf"]} - set(names))

    def rc(step):
        s = steps.get(step)
        return "-" if s is None else ("ok" if s[1] == "0" else f"exit {s[1]}")

    print(f"{'model':20} {'dump':8} {'hf':8} {'worst |dlogp| (case)':30} {'batch rel':>9} "
          f"{'greedy=tf':>9} {'graphs':>6} {'memcheck':18} {'b1 tok/s':>9} {'b1 %floor':>9} {'b3 tok/s':>9}")
    for n in names:
        cases = [g for (p, _), g in got["hf"].items() if p == n]
        worst = max(cases, key=lambda g: float(g[2]), default=None)
        w = f"{float(worst[2]):.4f} ({worst[1]})" if worst else "-"
        if any(g[5] == "FAIL" for g in cases):
            w += " FAIL"
        batch = got["batch"].get(n, (n, "-"))[1]
        gr = got["greedy"].get(n)
        greedy = f"{gr[1]}/{gr[2]}" if gr else "-"
        gg = got["graphs"].get(n)
        graphs = ("ok" if gg[2] == "true" else "DIFFER") if gg else "-"
        mc = next((g[1] for k, g in got["memcheck"].items() if k == n), "-")
        mc = mc.replace("ERROR SUMMARY: ", "")
        b = got["b1"].get(n)
        b1, pct, b3 = (b[1], b[4], b[5]) if b else ("-", "-", "-")
        print(f"{n:20} {rc('dump-' + n):8} {rc('hf-' + n):8} {w:30} {batch:>9} {greedy:>9} {graphs:>6} "
              f"{mc:18} {b1:>9} {pct:>9} {b3:>9}")
    print("limits: |dlogp| <= 0.2 nats (compare_hf.py), batch vs alone rel err <= 2e-2; "
          "b1 %floor: compare each family's with llama-3.2-1b's")


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "floor":
        floor(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
