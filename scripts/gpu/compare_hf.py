#!/usr/bin/env python3
"""Compares lamina's dump of a model (any family) with transformers in
float32 on the same weights.

Reads DUMP/dump.json and DUMP/{case}.f32, written by the
`cuda_family_dump_for_transformers` test (`crates/model/src/cuda/tests/
families.rs`): per case the input tokens, the positions scored and their
targets (the next token, teacher-forced), lamina's log-probability and
argmax at each, and the whole logit rows of a few positions. Runs
`AutoModelForCausalLM` from MODEL_DIR (local files only, float32, eager
attention, no TF32) on each case's tokens and prints per case:

  max|dlp| tf    largest |dlog-probability| of the scored targets (every position)
  max|dlp| rows  largest |dlog-probability| over the whole vocabulary of the kept rows
  rel err        ||lamina - transformers|| / ||transformers|| of the kept rows' logits
  <W / >=W       max|dlp| tf before / from the sliding window's length (Gemma 3)
  argmax=        share of scored positions where both argmaxes agree

Exits 1 when a case's max|dlp| (either) is over 0.2 nats or a value is not
finite; the relative error is reported, not judged. With --bf16-control it
also runs transformers in bfloat16 on the same tokens and prints, per case,
that run's max|dlp| tf against float32: how far bfloat16 arithmetic alone
moves this model (reported, not judged).

  compare_hf.py MODEL_DIR DUMP_DIR [--device cuda|cpu] [--bf16-control]

Needs torch and transformers; the GPU machine has no network, so nothing
is downloaded (HF_HUB_OFFLINE).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from transformers import AutoModelForCausalLM

LP = 0.2


def load(model_dir, device, dtype=torch.float32):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    kw = dict(local_files_only=True, attn_implementation="eager")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kw)
    except TypeError:  # transformers before `dtype`
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, **kw)
    model = model.to(dtype=dtype, device=device).eval()
    assert all(p.dtype == dtype for p in model.parameters()), f"not {dtype}"
    return model


@torch.no_grad()
def scored_logprobs(model, case, device):
    """The model's float32 logits of a case's tokens, teacher-forced, and
    the float64 log-probabilities of its scored positions' targets."""
    ids = torch.tensor([case["tokens"]], device=device)
    # no cache: a hybrid (sliding) cache is no part of one teacher-forced pass
    logits = model(ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()
    first, targets = case["first"], case["targets"]
    pos = torch.arange(first, first + len(targets), device=device)
    scored = torch.log_softmax(logits[pos].double(), -1)  # [scored, vocab]
    want = scored[torch.arange(len(targets), device=device), torch.tensor(targets, device=device)]
    return logits, pos, scored, want


def window(model_dir):
    """The sliding window's length where some layers have one, else None."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = cfg.get("sliding_window")
    if not w or cfg.get("use_sliding_window") is False:
        return None
    return w if w < cfg.get("max_position_embeddings", w + 1) else None


@torch.no_grad()
def compare(model, case, dump, vocab, device, win):
    logits, pos, scored, want = scored_logprobs(model, case, device)  # logits [len(tokens), vocab]
    assert logits.shape[1] == vocab, (logits.shape, vocab)
    got = torch.tensor(case["logprobs"], dtype=torch.float64, device=device)
    dtf = (got - want).abs()
    agree = (scored.argmax(-1).cpu() == torch.tensor(case["argmax"])).double().mean().item()
    split = None
    if win is not None and int(pos[-1]) >= win:
        before, after = dtf[pos < win], dtf[pos >= win]
        split = (before.max().item() if len(before) else 0.0, after.max().item())
    keep = case["keep"]
    rows = np.fromfile(os.path.join(dump, case["file"]), dtype="<f4").reshape(len(keep), vocab)
    mine = torch.from_numpy(rows).to(device).double()
    ref = logits[torch.tensor(keep, device=device)].double()
    rel = ((mine - ref).norm() / ref.norm()).item()
    drows = (torch.log_softmax(mine, -1) - torch.log_softmax(ref, -1)).abs().max().item()
    finite = bool(torch.isfinite(got).all() and torch.isfinite(mine).all())
    return dtf.max().item(), drows, rel, split, agree, finite, want


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("dump")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16-control", action="store_true")
    a = ap.parse_args()
    d = json.load(open(os.path.join(a.dump, "dump.json")))
    vocab, name = d["vocab"], d["model"]
    t0 = time.time()
    model = load(a.model_dir, a.device)
    print(f"{name}: transformers float32 on {a.device} loaded in {time.time() - t0:.1f} s")
    win = window(a.model_dir)
    head = f"{'case':16} {'max|dlp| tf':>11} {'max|dlp| rows':>13} {'rel err':>9} {'<W / >=W':>15} {'argmax=':>7} {'s':>5}"
    print(head)
    ok, fp32 = True, []
    for case in d["cases"]:
        t0 = time.time()
        dtf, drows, rel, split, agree, finite, want = compare(model, case, a.dump, vocab, a.device, win)
        fp32.append(want)
        good = finite and dtf <= LP and drows <= LP
        ok &= good
        sp = f"{split[0]:.3f} / {split[1]:.3f}" if split else "-"
        verdict = "ok" if good else "FAIL"
        print(f"{case['name']:16} {dtf:11.4f} {drows:13.4f} {rel:9.2e} {sp:>15} {agree:7.3f} {time.time() - t0:5.1f} {verdict}")
        print(f"RESULT hf {name} {case['name']} max|dlogp| {max(dtf, drows):.4f} rel {rel:.2e} argmax= {agree:.3f} {verdict}")
    print(f"limit: max|dlogp| <= {LP} nats; window W = {win}")
    if a.bf16_control:
        del model
        half = load(a.model_dir, a.device, torch.bfloat16)
        for case, want in zip(d["cases"], fp32):
            got = scored_logprobs(half, case, a.device)[3]
            print(f"RESULT hf {name} {case['name']} bf16 control max|dlogp| tf {(got - want).abs().max().item():.4f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
