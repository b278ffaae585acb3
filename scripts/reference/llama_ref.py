#!/usr/bin/env python3
"""Float32 numpy reference of the Llama forward pass: the oracle the golden
files and the GPU whole-model checks are measured against.

It shares no code with the engine on purpose (an independent second reading
of the architecture): embeddings, RMSNorm, rotate-half RoPE (with llama3
frequency scaling), grouped-query causal attention, SwiGLU, final norm and a
tied or untied LM head, every sequence recomputed from its first token.
The layer variants a model description can ask for are read from the
weights the checkpoint has: projection biases (`*_proj.bias`: Qwen2's Q/K/V,
`attention_bias`, `mlp_bias`), per-head QK-norm (`self_attn.q_norm` /
`k_norm`: Qwen3, Gemma 3) and output norms (`pre_feedforward_layernorm`
beside `post_attention_layernorm`: Gemma 3), each applied where
transformers applies it; Gemma 3's other fields from its config.json as
`Gemma3TextConfig` reads them: `(1 + w)` norm gains, the embedding scaled
by sqrt(hidden), GELU-tanh (`hidden_activation`), scores scaled by
`query_pre_attn_scalar^-1/2`, each layer's sliding window (`layer_types`
or `sliding_window_pattern`; a token sees itself and `sliding_window - 1`
positions before it) and RoPE base (`rope_local_base_freq` on the local
layers, `rope_theta` and `rope_scaling` on the global ones, or
`rope_parameters` per layer type), and `final_logit_softcapping`.

Inputs: a Hugging Face model directory (`config.json` and `*.safetensors` in
BF16, F16, F32, or FP8 e4m3 projections with their `weight_scale`, which
are dequantised exactly in float32; rope settings under `rope_theta` / `rope_scaling` or
`rope_parameters`; or a 4-bit GPTQ checkpoint, `lamina quantize --format
int4`'s layout, likewise dequantised), or a llama-architecture `.gguf` file, dequantised to
float32 by the `gguf` package (pinned in `xtask/src/ci.rs`) with llama.cpp's
Q/K row order turned back into Hugging Face's.

  llama_ref.py --model DIR_OR_GGUF --tokens 1,2,3 [--steps N] [--json OUT]

Greedy-decodes N tokens (default 8) after the prompt and prints them with
the top-5 logits of each step. `--json OUT` writes {"tokens", "generated",
"top5": [[[id, logit] x5] per step], "logits_last": every logit at the last
prompt position}.

As a module: `Model.load(path)` then `model.logits(tokens)` -> float32
array [len(tokens), vocab] (used by `tests/python/teacher_forced.py` and
`scripts/gpu/compare_oracle.py`).
"""
import argparse
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    vocab: int
    inv_freq: list  # per layer: float64 [head_dim / 2]
    window: list  # per layer: int, or None (whole context)
    norm_offset: float = 0.0  # RMSNorm gain is offset + w
    embed_scale: float = 1.0
    scale: float | None = None  # scores' scale; None: 1 / sqrt(head_dim)
    gelu: bool = False  # GELU-tanh gate, else SiLU
    final_cap: float | None = None


# ---------------------------------------------------------------- RoPE setup


def rope_frequencies(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """Inverse frequencies of rotary pairs, llama3-scaled when asked."""
    freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / freq
    # between the two bounds the frequency blends from scaled to unscaled
    blend = (original / wavelength - low) / (high - low)
    mid = (1 - blend) * freq / factor + blend * freq
    out = np.where(wavelength > original / low, freq / factor, mid)
    return np.where(wavelength < original / high, freq, out)


def is_gemma3(raw: dict) -> bool:
    return "Gemma3ForCausalLM" in (raw.get("architectures") or []) or raw.get("model_type") == "gemma3_text"


def gemma3_layers(raw: dict, head_dim: int) -> tuple[list, list]:
    """Gemma 3's per-layer RoPE frequencies and windows."""
    n = raw["num_hidden_layers"]
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)
    ]
    per_type = raw.get("rope_parameters") or {}
    full, local = per_type.get("full_attention"), per_type.get("sliding_attention")
    glob = rope_frequencies(
        head_dim,
        (full or {}).get("rope_theta") or raw.get("rope_theta") or 1_000_000.0,
        full or raw.get("rope_scaling") or {},
    )
    loc = rope_frequencies(
        head_dim,
        (local or {}).get("rope_theta") or raw.get("rope_local_base_freq") or 10_000.0,
        local or {},
    )
    window = raw.get("sliding_window") or 4096
    sliding = [t == "sliding_attention" for t in types]
    return [loc if s else glob for s in sliding], [window if s else None for s in sliding]


def hf_config(raw: dict) -> Config:
    params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = raw.get("rope_scaling") or params
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    layers = raw["num_hidden_layers"]
    cfg = Config(
        hidden=raw["hidden_size"],
        layers=layers,
        heads=heads,
        kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=head_dim,
        eps=raw["rms_norm_eps"],
        vocab=raw["vocab_size"],
        inv_freq=[rope_frequencies(head_dim, theta, scaling)] * layers,
        window=[None] * layers,
    )
    if is_gemma3(raw):
        cfg.inv_freq, cfg.window = gemma3_layers(raw, head_dim)
        cfg.norm_offset = 1.0
        cfg.embed_scale = float(np.float32(math.sqrt(raw["hidden_size"])))
        cfg.scale = (raw.get("query_pre_attn_scalar") or 256) ** -0.5
        cfg.gelu = (raw.get("hidden_activation") or "gelu_pytorch_tanh") == "gelu_pytorch_tanh"
        cfg.final_cap = raw.get("final_logit_softcapping")
    return cfg


# ------------------------------------------------------------------- loading

SAFETENSORS_DTYPES = {"F16": np.float16, "F32": np.float32}


def e4m3_table() -> np.ndarray:
    """The float32 value of every FP8 e4m3 ("fn") byte."""
    b = np.arange(256)
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 512.0, (1.0 + m / 8.0) * np.exp2(e.astype(np.float64) - 7.0))
    mag = np.where((e == 0xF) & (b & 7 == 7), np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


E4M3 = e4m3_table()


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + header_len])
    body = memoryview(data)[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = body[start:end]
        if info["dtype"] == "BF16":
            # bf16 is the high half of a float32
            values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F8_E4M3":
            values = E4M3[np.frombuffer(raw, np.uint8)]
        elif info["dtype"] == "I32":
            # packed 4-bit codes (GPTQ), kept as integers
            values = np.frombuffer(raw, np.int32)
        elif info["dtype"] in SAFETENSORS_DTYPES:
            values = np.frombuffer(raw, SAFETENSORS_DTYPES[info["dtype"]]).astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        tensors[name] = values.reshape(info["shape"])
    return tensors


def load_hf(directory: Path) -> tuple[Config, dict[str, np.ndarray]]:
    raw = json.loads((directory / "config.json").read_text())
    cfg = hf_config(raw)
    weights: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        weights.update(read_safetensors(file))
    quant = raw.get("quantization_config") or {}
    if quant.get("quant_method") == "gptq":
        weights = dequantize_gptq(weights, quant)
    return cfg, dequantize_fp8(weights)


def unpack_nibbles(words: np.ndarray, axis: int) -> np.ndarray:
    """4-bit codes of int32 words, nibble i of a word at index 8j + i along `axis`."""
    u = words.astype(np.uint32)
    nib = np.stack([(u >> (4 * i)) & 0xF for i in range(8)], axis=axis + 1)
    shape = list(words.shape)
    shape[axis] *= 8
    return nib.reshape(shape).astype(np.float32)


def dequantize_gptq(weights: dict[str, np.ndarray], quant: dict) -> dict[str, np.ndarray]:
    """A GPTQ checkpoint's 4-bit projections as float32 `[out, in]`:
    `qweight` [in / 8, out], `qzeros` [groups, out / 8] (checkpoint format
    "gptq": a stored zero is the zero minus 1), `scales` [groups, out] and
    `g_idx` [in] (each input column's group; `i // group_size` without
    `desc_act`); w = (q - zero) * scale in float32."""
    if quant.get("bits") != 4:
        raise SystemExit(f"GPTQ with {quant.get('bits')} bits: only 4 is read")
    v1 = quant.get("checkpoint_format", "gptq") == "gptq"
    out = {}
    for name, w in weights.items():
        if not name.endswith(".qweight"):
            if not name.endswith((".qzeros", ".scales", ".g_idx")):
                out[name] = w
            continue
        p = name[: -len("qweight")]
        q = unpack_nibbles(w, 0)  # [in, out]
        zeros = unpack_nibbles(weights[p + "qzeros"], 1) + (1.0 if v1 else 0.0)  # [groups, out]
        scales = weights[p + "scales"].astype(np.float32)
        k = q.shape[0]
        group = quant.get("group_size", -1)
        if quant.get("desc_act") and p + "g_idx" in weights:
            g = weights[p + "g_idx"].astype(np.int64)
        else:
            g = np.arange(k) // (k if group == -1 else group)
        out[p + "weight"] = ((q - zeros[g]) * scales[g]).astype(np.float32).T.copy()
    return out


def dequantize_fp8(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An FP8 checkpoint's projections times their `weight_scale` (one per
    tensor, or one per output row), exactly in float32; scales dropped."""
    out = {}
    for name, w in weights.items():
        if name.endswith((".weight_scale", ".input_scale", ".k_scale", ".v_scale")):
            continue
        scale = weights.get(name[: -len("weight")] + "weight_scale") if name.endswith(".weight") else None
        if scale is not None:
            w = w * scale.reshape(-1, 1) if scale.size > 1 else w * scale.reshape(())
        out[name] = w
    return out


GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp interleaves each head's rotary halves (row pairs 0,d/2 ->
    0,1); this puts the halves back one after the other."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def load_gguf(path: Path) -> tuple[Config, dict[str, np.ndarray]]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))

    def meta(key: str, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    heads = meta("llama.attention.head_count")
    kv_heads = meta("llama.attention.head_count_kv", heads)
    weights = {}
    for t in reader.tensors:
        # GGUF lists dimensions fastest-varying first
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(list(reversed(t.shape.tolist())))
        if t.name in GGUF_GLOBAL:
            weights[GGUF_GLOBAL[t.name]] = w
            continue
        _, layer, kind, suffix = t.name.split(".")
        if kind == "attn_q":
            w = unpermute_rows(w, heads)
        elif kind == "attn_k":
            w = unpermute_rows(w, kv_heads)
        weights[f"model.layers.{layer}.{GGUF_LAYER[kind]}.{suffix}"] = w
    hidden = meta("llama.embedding_length")
    raw = {
        "hidden_size": hidden,
        "num_hidden_layers": meta("llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": meta("llama.attention.key_length", hidden // heads),
        "rms_norm_eps": meta("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta("llama.rope.freq_base", 10000.0),
        "vocab_size": weights["model.embed_tokens.weight"].shape[0],
    }
    return hf_config(raw), weights


# ------------------------------------------------------------------- forward


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + gain)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class Model:
    def __init__(self, cfg: Config, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        self.w = weights
        self.head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])

    @classmethod
    def load(cls, path: str | Path) -> "Model":
        path = Path(path)
        return cls(*(load_gguf(path) if path.suffix == ".gguf" else load_hf(path)))

    def rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x [T, heads, head_dim]: rotate-half RoPE at positions 0..T."""
        half = self.cfg.head_dim // 2
        lo, hi = x[..., :half], x[..., half:]
        return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        """x @ W.T for projection `name` (`...q_proj`), plus its bias when it has one."""
        y = x @ self.w[name + ".weight"].T
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def heads(self, p: str, which: str, h: np.ndarray, count: int) -> np.ndarray:
        """Projection `which` (q, k or v) as [T, count, head_dim], QK-normed per head where the model has it."""
        x = self.linear(p + f"self_attn.{which}_proj", h).reshape(len(h), count, self.cfg.head_dim)
        gain = self.w.get(p + f"self_attn.{which}_norm.weight")
        return x if gain is None else self.norm(x, gain)

    def norm(self, x: np.ndarray, gain: np.ndarray) -> np.ndarray:
        return rms_norm(x, gain, self.cfg.eps, self.cfg.norm_offset)

    def attention(self, p: str, h: np.ndarray, cos, sin, mask) -> np.ndarray:
        c, n = self.cfg, len(h)
        q = self.rotate(self.heads(p, "q", h, c.heads), cos, sin)
        k = self.rotate(self.heads(p, "k", h, c.kv_heads), cos, sin)
        v = self.heads(p, "v", h, c.kv_heads)
        group = c.heads // c.kv_heads
        out = np.empty_like(q)
        for head in range(c.heads):
            kv = head // group
            dots = q[:, head] @ k[:, kv].T
            scores = (dots / math.sqrt(c.head_dim) if c.scale is None else dots * np.float32(c.scale)) + mask
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head] = probs @ v[:, kv]
        return self.linear(p + "self_attn.o_proj", out.reshape(n, c.heads * c.head_dim))

    def mlp(self, p: str, h: np.ndarray) -> np.ndarray:
        gate = self.linear(p + "mlp.gate_proj", h)
        up = self.linear(p + "mlp.up_proj", h)
        act = gelu_tanh(gate) if self.cfg.gelu else silu(gate)
        return self.linear(p + "mlp.down_proj", act * up)

    def logits(self, tokens) -> np.ndarray:
        """Causal forward over `tokens`: float32 logits [len(tokens), vocab]."""
        c, w = self.cfg, self.w
        n = len(tokens)
        pos = np.arange(n)
        x = w["model.embed_tokens.weight"][np.asarray(tokens)] * np.float32(c.embed_scale)
        for layer in range(c.layers):
            p = f"model.layers.{layer}."
            angles = np.outer(pos, c.inv_freq[layer])
            cos = np.cos(angles).astype(np.float32)[:, None, :]
            sin = np.sin(angles).astype(np.float32)[:, None, :]
            # token i sees j <= i, and only i - j < window on a windowed layer
            seen = pos[None, :] <= pos[:, None]
            if c.window[layer] is not None:
                seen &= pos[:, None] - pos[None, :] < c.window[layer]
            mask = np.where(seen, 0, -np.inf).astype(np.float32)
            a = self.attention(p, self.norm(x, w[p + "input_layernorm.weight"]), cos, sin, mask)
            pre_mlp = w.get(p + "pre_feedforward_layernorm.weight")
            if pre_mlp is None:
                x = x + a
                x = x + self.mlp(p, self.norm(x, w[p + "post_attention_layernorm.weight"]))
            else:  # output norms on both halves (Gemma 3)
                x = x + self.norm(a, w[p + "post_attention_layernorm.weight"])
                m = self.mlp(p, self.norm(x, pre_mlp))
                x = x + self.norm(m, w[p + "post_feedforward_layernorm.weight"])
        logits = self.norm(x, w["model.norm.weight"]) @ self.head.T
        if c.final_cap is not None:
            logits = np.float32(c.final_cap) * np.tanh(logits / np.float32(c.final_cap))
        return logits


# ----------------------------------------------------------------------- CLI


def greedy(model: Model, prompt: list[int], steps: int):
    """Greedy continuation: (generated ids, top-5 per step, prompt's last logits)."""
    seq = list(prompt)
    last = model.logits(seq)[-1]
    logits, generated, top5 = last, [], []
    for step in range(steps):
        best = np.argsort(-logits, kind="stable")[:5]
        top5.append([[int(t), float(logits[t])] for t in best])
        generated.append(int(best[0]))
        seq.append(int(best[0]))
        if step + 1 < steps:
            logits = model.logits(seq)[-1]
    return generated, top5, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face directory or .gguf file")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--steps", type=int, default=8, help="greedy tokens to generate")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model = Model.load(args.model)
    prompt = [int(t) for t in args.tokens.split(",")]
    bad = [t for t in prompt if not 0 <= t < model.cfg.vocab]
    if bad:
        raise SystemExit(f"--tokens: ids {bad} outside the vocabulary (size {model.cfg.vocab})")
    generated, top5, last = greedy(model, prompt, args.steps)
    print("prompt:", prompt)
    print("greedy:", generated)
    for step, row in enumerate(top5):
        print(f"step {step}: " + "  ".join(f"{t}:{v:.4f}" for t, v in row))
    if args.json:
        out = {"tokens": prompt, "generated": generated, "top5": top5, "logits_last": [float(v) for v in last]}
        Path(args.json).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
