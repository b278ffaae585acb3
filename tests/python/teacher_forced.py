#!/usr/bin/env python3
"""Teacher-forced log-probabilities from the float32 reference on a GGUF
(dequantised by the reference's own GGUF reader), for
`cargo xtask regen-references --only smollm2-q4_1`.

  teacher_forced.py REFERENCE.py MODEL.gguf IN.json OUT.json

REFERENCE.py is `scripts/reference/llama_ref.py`. IN: {"sequences": [[token
ids], ...]}. OUT: {"logprobs": [[...], ...]}: for each sequence, entry i is
log p(seq[i + 1] | seq[..= i]) under the reference's forward pass (float64
log-softmax of its float32 logits), len(seq) - 1 values.
"""
import importlib.util, json, sys
import numpy as np

reference, gguf, inp, out = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("llama_ref", reference)
llama_ref = importlib.util.module_from_spec(spec)
sys.modules["llama_ref"] = llama_ref
spec.loader.exec_module(llama_ref)
model = llama_ref.Model.load(gguf)
result = []
for seq in json.load(open(inp))["sequences"]:
    logits = model.logits(seq).astype(np.float64)  # [T, vocab]
    top = logits.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[:, 0]
    result.append([float(logits[i, seq[i + 1]] - lse[i]) for i in range(len(seq) - 1)])
json.dump({"logprobs": result}, open(out, "w"))
