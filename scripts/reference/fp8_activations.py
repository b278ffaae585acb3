#!/usr/bin/env python3
"""What FP8 (e4m3) activations cost a model's perplexity, apart from its
weights: a numpy fp32 forward pass of a Llama GGUF (SmolLM2-135M's is the
default model's) in which chosen projections see their input rounded to
e4m3 with one scale per token (max |x| -> 448, as the CUDA backend's
`--fp8-activations` GEMMs do), the weights left as they are.

Rows: all four projection inputs; each alone; all four with only the
mantissa rounded (no exponent range: what no choice of scales can remove);
and with SmoothQuant-style migration (per input channel
s = max|x|^a / max|w|^(1-a) from the calibration text, folded into the
norms, V and up), which moves range, not rounding; and with each input
rotated by a random orthogonal matrix (the weights alike, so the product
is unchanged: QuaRot-style, which spreads outliers over the channels). On
~2,000 tokens one rounding's cost is a draw with a spread of several
tenths of a percent, so each row is the mean of `--draws` dithered
roundings (`E4m3Rows`).

    pip install numpy ml_dtypes gguf tokenizers
    python3 scripts/reference/fp8_activations.py MODEL.gguf \\
        --text tests/text/lighthouses.txt --calibration tests/text/calibration.txt

The tokenizer is rebuilt from the GGUF's BPE vocabulary and merges
(byte-level, digits split), so figures compare rows of one run, not runs of
`lamina perplexity`. Windows of `--context` tokens, as `lamina perplexity
--score-all`.
"""
import argparse
import time

import gguf
import ml_dtypes
import numpy as np
from gguf.quants import dequantize

E4M3_MAX = 448.0
KINDS = ("qkv", "o", "gu", "down")


def load(path):
    r = gguf.GGUFReader(path)

    def field(k):
        f = r.fields[k]
        return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]

    def num(k):
        f = r.fields[k]
        return f.parts[f.data[0]][0]

    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else a
    cfg = dict(
        layers=int(num("llama.block_count")),
        heads=int(num("llama.attention.head_count")),
        kv=int(num("llama.attention.head_count_kv")),
        theta=float(num("llama.rope.freq_base")),
        eps=float(num("llama.attention.layer_norm_rms_epsilon")),
    )
    cfg["dim"] = w["blk.0.attn_q.weight"].shape[0] // cfg["heads"]
    if "output.weight" not in w:
        w["output.weight"] = w["token_embd.weight"]
    from tokenizers import Tokenizer, models, pre_tokenizers

    toks = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return w, cfg, tk


class E4m3Rows:
    """x rounded to e4m3 with one scale per row (max |x| -> 448); with a
    seed, each row's scale is first enlarged by a random factor in [1, 2)
    (a dither: the same precision, other rounding boundaries), so several
    draws estimate the expected cost rather than one draw of it."""

    def __init__(self, seed=None):
        self.rng = None if seed is None else np.random.default_rng(seed)

    def __call__(self, x):
        s = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-12) / E4M3_MAX
        if self.rng is not None:
            s = s * (1 + self.rng.random(s.shape)).astype(np.float32)
        return (x / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s


e4m3_rows = E4m3Rows()


def mantissa3(x):
    """x with 3 mantissa bits kept, any exponent."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 16) / 16, e)


def forward(w, cfg, ids, quant, rounder=e4m3_rows, stats=None, rot=None):
    """Logits [T, vocab] in f32 arithmetic; inputs of the projections in
    `quant` rounded."""
    L, H, KV, D, eps = cfg["layers"], cfg["heads"], cfg["kv"], cfg["dim"], cfg["eps"]
    T = len(ids)
    x = w["token_embd.weight"][ids]
    inv = cfg["theta"] ** (-np.arange(0, D, 2) / D)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.cos(ang)[:, None, :].astype(np.float32)
    sin = np.sin(ang)[:, None, :].astype(np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    def rope(v):  # GGUF's Q/K rows are permuted for interleaved pairs
        a, b = v[..., 0::2], v[..., 1::2]
        o = np.empty_like(v)
        o[..., 0::2], o[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return o

    def mm(name, inp, kind, l):
        if stats is not None:
            stats.setdefault((l, kind), []).append(np.abs(inp).max(0))
        wt = w[f"blk.{l}.{name}.weight"]
        if rot is not None:  # x Q (Q orthogonal) against W Q: the same product
            q = rot[inp.shape[-1]]
            inp, wt = inp @ q, wt @ q
        if kind in quant:
            inp = rounder(inp)
        return inp @ wt.T

    for l in range(L):
        h = rms(x, w[f"blk.{l}.attn_norm.weight"])
        q = rope(mm("attn_q", h, "qkv", l).reshape(T, H, D))
        k = rope(mm("attn_k", h, "qkv", l).reshape(T, KV, D))
        v = mm("attn_v", h, "qkv", l).reshape(T, KV, D)
        k, v = np.repeat(k, H // KV, 1), np.repeat(v, H // KV, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(D)) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, H * D)
        x = x + mm("attn_output", a, "o", l)
        h = rms(x, w[f"blk.{l}.ffn_norm.weight"])
        g, u = mm("ffn_gate", h, "gu", l), mm("ffn_up", h, "gu", l)
        x = x + mm("ffn_down", g / (1 + np.exp(-g)) * u, "down", l)
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


def perplexity(w, cfg, ids, ctx, quant=(), rounder=e4m3_rows, rot=None):
    nll, n = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        win = ids[s : s + ctx]
        if len(win) < 2:
            break
        lg = forward(w, cfg, np.array(win), quant, rounder, rot=rot).astype(np.float64)
        lg -= lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        nll -= lp[np.arange(len(win) - 1), win[1:]].sum()
        n += len(win) - 1
    return float(np.exp(nll / n))


def smoothed(w, cfg, amax, alpha):
    """Weights with each projection input's range migrated into the weights."""
    L, H, KV, D = cfg["layers"], cfg["heads"], cfg["kv"], cfg["dim"]
    out = dict(w)

    def factor(act, wmax):
        s = np.maximum(act, 1e-5) ** alpha / np.maximum(wmax, 1e-5) ** (1 - alpha)
        return np.clip(s, 1e-2, 1e2)

    def scale_inputs(l, names, s):
        for n in names:
            out[f"blk.{l}.{n}.weight"] = out[f"blk.{l}.{n}.weight"] * s[None, :]

    for l in range(L):
        for kind, names, norm in (
            ("qkv", ("attn_q", "attn_k", "attn_v"), "attn_norm"),
            ("gu", ("ffn_gate", "ffn_up"), "ffn_norm"),
        ):
            wmax = np.max([np.abs(out[f"blk.{l}.{n}.weight"]).max(0) for n in names], 0)
            s = factor(amax[(l, kind)], wmax)
            out[f"blk.{l}.{norm}.weight"] = out[f"blk.{l}.{norm}.weight"] / s
            scale_inputs(l, names, s)
        s = factor(amax[(l, "down")], np.abs(out[f"blk.{l}.ffn_down.weight"]).max(0))
        out[f"blk.{l}.ffn_up.weight"] = out[f"blk.{l}.ffn_up.weight"] / s[:, None]
        scale_inputs(l, ("ffn_down",), s)
        # O's input channel c reads V channel (c's KV head, c % D): one factor per V channel
        s = factor(amax[(l, "o")], np.abs(out[f"blk.{l}.attn_output.weight"]).max(0))
        s = s.reshape(KV, H // KV, D).max(1)
        out[f"blk.{l}.attn_v.weight"] = out[f"blk.{l}.attn_v.weight"] / s.reshape(-1)[:, None]
        scale_inputs(l, ("attn_output",), np.repeat(s[:, None, :], H // KV, 1).reshape(-1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--text", required=True)
    ap.add_argument("--calibration", required=True, help="text the smoothing factors come from")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--alphas", default="0.5")
    ap.add_argument("--draws", type=int, default=4, help="dithered roundings per row")
    a = ap.parse_args()
    w, cfg, tk = load(a.gguf)
    ids = tk.encode(open(a.text, encoding="utf-8").read()).ids
    base = perplexity(w, cfg, ids, a.context)
    print(f"{len(ids)} tokens; fp32 perplexity {base:.4f}")

    def draws(weights, kinds, rot=None):
        got = [perplexity(weights, cfg, ids, a.context, kinds, E4m3Rows(d), rot) for d in range(a.draws)]
        return [100 * (p / base - 1) for p in got]

    def row(name, pcts):
        mean, sd = np.mean(pcts), np.std(pcts, ddof=1) if len(pcts) > 1 else 0.0
        each = " / ".join(f"{p:+.2f}" for p in pcts)
        print(f"| {name} | {mean:+.2f}% ± {sd:.2f} | {each} |", flush=True)

    print("| activations | mean against fp32 ± sd | each draw (%) |\n|---|---|---|")
    row("e4m3, all four inputs", draws(w, KINDS))
    for kind in KINDS:
        row(f"e4m3, {kind} input only", draws(w, (kind,)))
    p = perplexity(w, cfg, ids, a.context, KINDS, mantissa3)
    row("3-bit mantissa, all four (no draws)", [100 * (p / base - 1)])
    rng = np.random.default_rng(0)
    widths = {w[f"blk.0.{n}.weight"].shape[1] for n in ("attn_q", "attn_output", "ffn_down")}
    rot = {k: np.linalg.qr(rng.standard_normal((k, k)))[0].astype(np.float32) for k in widths}
    row("all four, inputs rotated (random orthogonal)", draws(w, KINDS, rot))
    cal = tk.encode(open(a.calibration, encoding="utf-8").read()).ids
    stats = {}
    for s in range(0, min(len(cal), 4 * a.context), a.context):
        forward(w, cfg, np.array(cal[s : s + a.context]), (), stats=stats)
    amax = {k: np.max(v, 0) for k, v in stats.items()}
    for alpha in (float(x) for x in a.alphas.split(",")):
        ws = smoothed(w, cfg, amax, alpha)
        row(f"e4m3, all four, smoothed a = {alpha}", draws(ws, KINDS))


if __name__ == "__main__":
    t = time.time()
    main()
    print(f"({time.time() - t:.0f} s)")
