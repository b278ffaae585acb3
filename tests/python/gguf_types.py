"""Writes GGUF files of every tensor type lamina dequantises, with the `gguf`
package (pinned in xtask/src/ci.rs), and the package's own dequantisation of
each tensor as the reference.

Usage: gguf_types.py WEIGHTS ROWS COLS OUT_DIR
       gguf_types.py model OUT_DIR
The first form writes into OUT_DIR (WEIGHTS: ROWS x COLS little-endian f32
synthetic weights, row-major):
  types.gguf        one tensor `w.<TYPE>` per type, quantised from WEIGHTS
  <TYPE>.f32        gguf.quants.dequantize of that tensor as read back
  unsupported.gguf  one TQ2_0 tensor `w.unsupported` (a type lamina refuses)

The second form writes `llama.gguf`, a two-layer llama (hidden 256, so the
K types fit its rows) whose projections use every type (a Q4_K_M-like mix in
layer 0, the others in layer 1) with a byte-level BPE vocabulary, and
`ref/<Hugging Face name>.f32`: each tensor dequantised by the package, in
Hugging Face layout (llama.cpp's Q/K row permutation undone).

Types the package can quantise (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1) are quantised from the weights; for the K types (Q2_K..Q6_K), which
it can only dequantise, each super-block gets its f16 scales from the
weights' block maximum and seeded random bits for everything else, so every
field of the layout is exercised.
"""

import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

QUANTISED = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
# (type, bytes per 256-element block, byte offsets of f16 scales)
K_TYPES = [
    (T.Q2_K, 84, [80, 82]),
    (T.Q3_K, 110, [108]),
    (T.Q4_K, 144, [0, 2]),
    (T.Q5_K, 176, [0, 2]),
    (T.Q6_K, 210, [208]),
]


def k_blocks(w, size, scale_offsets, rng):
    blocks = w.reshape(-1, 256)
    raw = rng.integers(0, 256, size=(blocks.shape[0], size), dtype=np.uint8)
    amax = np.abs(blocks).max(axis=1).astype(np.float32)
    for i, off in enumerate(scale_offsets):
        scale = (amax / (31.0 + 32.0 * i)).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(w.shape[0], -1)


def quantised(w, t, rng):
    """`w` stored as type `t` (raw bytes for the K types)."""
    for kt, size, offsets in K_TYPES:
        if kt == t:
            return k_blocks(w, size, offsets, rng)
    return w if t == T.F32 else quantize(w, t)


HEADS, KV_HEADS, HIDDEN, FFN, LAYERS = 4, 2, 256, 512, 2
LAYER_TYPES = [
    # q, k, v, o, gate, up, down
    [T.Q4_K, T.Q4_K, T.Q6_K, T.Q4_K, T.Q4_K, T.Q4_K, T.Q6_K],
    [T.Q2_K, T.Q3_K, T.Q5_K, T.Q5_0, T.Q5_1, T.Q4_0, T.Q4_1],
]
HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    top = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, layer, kind, _ = name.split(".")
    return f"model.layers.{layer}.{HF[kind]}.weight"


def unpermute(w, heads):
    """Inverse of convert_hf_to_gguf.py's `permute` of the Q/K rows."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def model(out):
    rng = np.random.default_rng(7)
    tokens = ["a", "b", "ab", "\u0120", "\u0120a", "<s>", "</s>", "c"]
    writer = gguf.GGUFWriter(os.path.join(out, "llama.gguf"), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1, 1, 1, 1, 1, 3, 3, 1])
    writer.add_token_merges(["a b", "\u0120 a"])
    writer.add_bos_token_id(5)
    writer.add_eos_token_id(6)

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", quantize(normal(len(tokens), HIDDEN), T.Q8_0),
                      raw_dtype=T.Q8_0)
    writer.add_tensor("output_norm.weight", 1.0 + normal(HIDDEN, scale=0.05))
    # the K types' random scale bits reach ~30x (Q6_K: ~130x) the block
    # maximum: start them smaller so every tensor's weights are of one size
    writer.add_tensor("output.weight",
                      quantised(normal(len(tokens), HIDDEN, scale=0.02 / 64), T.Q6_K, rng),
                      raw_dtype=T.Q6_K)
    head_dim = HIDDEN // HEADS
    shapes = [(HIDDEN, HIDDEN), (KV_HEADS * head_dim, HIDDEN), (KV_HEADS * head_dim, HIDDEN),
              (HIDDEN, HIDDEN), (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
    kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    for layer, types in enumerate(LAYER_TYPES):
        for norm in ["attn_norm", "ffn_norm"]:
            writer.add_tensor(f"blk.{layer}.{norm}.weight", 1.0 + normal(HIDDEN, scale=0.05))
        for kind, shape, t in zip(kinds, shapes, types):
            # (as the head's)
            k_type = any(kt == t for kt, _, _ in K_TYPES)
            w = normal(*shape, scale=0.02 / 16 if k_type else 0.02)
            writer.add_tensor(f"blk.{layer}.{kind}.weight", quantised(w, t, rng), raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ref = os.path.join(out, "ref")
    os.makedirs(ref, exist_ok=True)
    for t in gguf.GGUFReader(os.path.join(out, "llama.gguf")).tensors:
        w = dequantize(t.data, t.tensor_type).astype("<f4")
        if ".attn_q." in t.name:
            w = unpermute(w, HEADS)
        elif ".attn_k." in t.name:
            w = unpermute(w, KV_HEADS)
        w.tofile(os.path.join(ref, hf_name(t.name) + ".f32"))


def main():
    if sys.argv[1] == "model":
        return model(sys.argv[2])
    weights, rows, cols, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    w = np.fromfile(weights, dtype="<f4").reshape(rows, cols)
    rng = np.random.default_rng(20261201)
    writer = gguf.GGUFWriter(os.path.join(out, "types.gguf"), "llama")
    for t in QUANTISED:
        data = w if t == T.F32 else quantize(w, t)
        writer.add_tensor(f"w.{t.name}", data, raw_dtype=t)
    for t, size, offsets in K_TYPES:
        writer.add_tensor(f"w.{t.name}", k_blocks(w, size, offsets, rng), raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = gguf.GGUFReader(os.path.join(out, "types.gguf"))
    for t in reader.tensors:
        ref = dequantize(t.data, t.tensor_type).astype("<f4")
        assert ref.size == rows * cols, (t.name, ref.shape)
        ref.tofile(os.path.join(out, t.name[2:] + ".f32"))

    writer = gguf.GGUFWriter(os.path.join(out, "unsupported.gguf"), "llama")
    writer.add_tensor("w.unsupported", quantize(w, T.TQ2_0), raw_dtype=T.TQ2_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
