#!/usr/bin/env python3
"""Teacher-forced log-probabilities from the oracle on a GGUF (dequantised to
float32 by the oracle's own GGUF reader), for `cargo xtask regen-references`.

  teacher_forced.py ORACLE.py MODEL.gguf IN.json OUT.json

IN: {"sequences": [[token ids], ...]}. OUT: {"logprobs": [[...], ...]}: for
each sequence, entry i is log p(seq[i + 1] | seq[..= i]) under the oracle's
forward pass (float64 log-softmax of its logits), len(seq) - 1 values.
"""
import importlib.util, json, sys
import numpy as np

oracle_path, gguf, inp, out = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("llama_ref", oracle_path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
cfg, w = ref.load_gguf(gguf)
result = []
for seq in json.load(open(inp))["sequences"]:
    logits = ref.forward(cfg, w, seq).astype(np.float64)  # [T, vocab]
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    result.append([float(logits[i, seq[i + 1]] - lse[i]) for i in range(len(seq) - 1)])
json.dump({"logprobs": result}, open(out, "w"))
