#!/usr/bin/env python3
"""Logits of a Hugging Face model directory under transformers in float32
on the CPU, for `tests/hf_families.rs` (lamina's CPU backend checked
against transformers on the same synthetic weights).

  hf_logits.py MODEL_DIR TOKENS OUT

TOKENS: comma-separated ids, one sequence. OUT: raw little-endian float32
logits, [len(TOKENS), vocab_size] row-major. Needs torch and transformers
(e.g. PYTHONPATH=/tmp/tfenv/site).
"""
import sys

import torch
from transformers import AutoModelForCausalLM

model_dir, tokens, out = sys.argv[1:4]
ids = torch.tensor([[int(t) for t in tokens.split(",")]])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model.eval()
with torch.no_grad():
    logits = model(ids).logits[0].to(torch.float32).contiguous()
open(out, "wb").write(logits.numpy().astype("<f4").tobytes())
