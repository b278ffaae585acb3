"""Writes a random-weight Llama GGUF in F16 with Llama 3.2 1B's shapes (by
default), for comparing quantised CPU kernels with llama.cpp on a type
SmolLM2 cannot hold (its rows of 576 are not whole Q4_K super-blocks).

Usage: synthetic-gguf.py OUT.gguf [--layers 16] [--hidden 2048] [--ffn 8192]
                         [--heads 32] [--kv-heads 8] [--vocab 128256]
                         [--type f16|q8_0|q4_0|q4_1]

`--type` other than f16 stores the embedding and every projection in that
block type (the `gguf` package's own quantiser, as llama-quantize --pure
would; no llama.cpp needed), for the GPU's GGUF kernels on a machine
without llama.cpp.

Then quantise it with llama.cpp's tool (built by build-llama-bench.sh) and
run both engines on the result, e.g. for Q4_K everywhere:
  llama-quantize --pure OUT.gguf OUT-q4_k.gguf Q4_K 2
  cargo run --release -p cli -- bench --device cpu --model OUT-q4_k.gguf \\
      --workloads b1,b2 --llama-bench llama-bench

The vocabulary is byte-level BPE (`llama-bpe` pre-tokeniser): the 256 byte
symbols, one merge (two spaces), then filler tokens up to `--vocab`, so text
tokenises to bytes. Weights ~N(0, 0.02), norms 1; the embedding is tied. Needs numpy
and the `gguf` package (`cargo xtask test` installs it into .cache/pydeps;
run with PYTHONPATH=.cache/pydeps).
"""

import argparse

import numpy as np
import gguf


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--type", default="f16", choices=["f16", "q8_0", "q4_0", "q4_1"])
    a = p.parse_args()
    rng = np.random.default_rng(20261201)
    tokens = byte_symbols() + ["\u0120\u0120"]
    tokens += [f"<filler {i}>" for i in range(a.vocab - len(tokens) - 2)]
    tokens += ["<|begin_of_text|>", "<|end_of_text|>"]
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_block_count(a.layers)
    w.add_context_length(4096)
    w.add_embedding_length(a.hidden)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    w.add_token_merges(["\u0120 \u0120"])  # llama.cpp needs at least one
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)

    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
             "q4_1": gguf.GGMLQuantizationType.Q4_1}.get(a.type)

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def add_matrix(name, *shape):
        x = normal(*shape)
        if qtype is None:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), qtype), raw_dtype=qtype)

    h, hd = a.hidden, a.hidden // a.heads
    add_matrix("token_embd.weight", a.vocab, h)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    shapes = {
        "attn_q": (h, h), "attn_k": (a.kv_heads * hd, h), "attn_v": (a.kv_heads * hd, h),
        "attn_output": (h, h), "ffn_gate": (a.ffn, h), "ffn_up": (a.ffn, h),
        "ffn_down": (h, a.ffn),
    }
    for layer in range(a.layers):
        for norm in ["attn_norm", "ffn_norm"]:
            w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(h, dtype=np.float32))
        for kind, shape in shapes.items():
            add_matrix(f"blk.{layer}.{kind}.weight", *shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
