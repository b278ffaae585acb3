#!/usr/bin/env python3
"""Compares the CUDA backend's dumped logits with the float32 reference
(`scripts/reference/llama_ref.py`).

Reads DUMP/tokens.json and the raw little-endian float32 files written by
the `cuda_llama_1b_dump_for_oracle` test (prompt_{7,300,2000}.f32: logits of
every prompt position; generated.f32: the teacher-forced logits behind the 64
generated tokens; spec_tokens / spec_logprobs in tokens.json: the same request
decoded with verify rows, and the log-probability of each token its row
sampled), runs `llama_ref.Model.logits` (imported as a module, fp32) on
the same tokens, and prints relative error ||a-b||/||b|| and the largest
log-probability difference per case. Exits 1 when a case breaks the limits
(rel err 3e-2, |dlogprob| 0.2).

  compare_oracle.py MODEL_DIR DUMP_DIR REFERENCE_DIR

REFERENCE_DIR holds llama_ref.py (devrun/ on the GPU machine).
"""
import json, os, sys, time
import numpy as np

REL, LP = 3e-2, 0.2


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def main():
    model_dir, dump, reference = sys.argv[1:4]
    sys.path.insert(0, reference)
    import llama_ref
    model = llama_ref.Model.load(model_dir)
    V = model.cfg.vocab
    toks = json.load(open(os.path.join(dump, "tokens.json")))
    cases = [(f"prompt {n}", toks[f"prompt_{n}"], f"prompt_{n}.f32", None) for n in (7, 300, 2000)]
    p, g = toks["gen_prompt"], toks["generated"]
    cases.append(("64 generated (teacher-forced)", p + g[:-1], "generated.f32", len(p) - 1))
    rows, ok = [], True
    for name, seq, fn, first in cases:
        t0 = time.time()
        ref = model.logits(seq)
        if first is not None:
            ref = ref[first:]
        got = np.fromfile(os.path.join(dump, fn), dtype=np.float32).reshape(-1, V)
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        dlp = float(np.abs(log_softmax(got.astype(np.float64)) - log_softmax(ref.astype(np.float64))).max())
        agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
        good = rel <= REL and dlp <= LP and np.isfinite(got).all()
        ok &= good
        rows.append((name, rel, dlp, agree, time.time() - t0, good))
    if "spec_tokens" in toks:
        # verify rows (speculative decoding): each sampled token's log-probability
        t0 = time.time()
        st, lp = toks["spec_tokens"], np.array(toks["spec_logprobs"])
        ref = log_softmax(model.logits(p + st[:-1])[len(p) - 1:].astype(np.float64))
        want = ref[np.arange(len(st)), st]
        dlp = float(np.abs(lp - want).max())
        agree = float((ref.argmax(-1) == np.array(st)).mean())
        good = dlp <= LP and np.isfinite(lp).all()
        ok &= good
        rows.append((f"{len(st)} speculative (verify rows)", float("nan"), dlp, agree, time.time() - t0, good))
    print(f"{'case':32} {'rel err':>9} {'max|dlogp|':>10} {'argmax=':>8} {'oracle s':>8}")
    for name, rel, dlp, agree, dt, good in rows:
        print(f"{name:32} {rel:9.3e} {dlp:10.4f} {agree:8.3f} {dt:8.1f} {'ok' if good else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
