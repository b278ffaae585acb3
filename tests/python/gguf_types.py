"""Writes GGUF files of every tensor type lamina dequantises, with the `gguf`
package (pinned in xtask/src/ci.rs), and the package's own dequantisation of
each tensor as the reference.

Usage: gguf_types.py WEIGHTS ROWS COLS OUT_DIR
  WEIGHTS  ROWS x COLS little-endian f32 synthetic weights (row-major)
Writes into OUT_DIR:
  types.gguf        one tensor `w.<TYPE>` per type, quantised from WEIGHTS
  <TYPE>.f32        gguf.quants.dequantize of that tensor as read back
  unsupported.gguf  one TQ2_0 tensor `w.unsupported` (a type lamina refuses)

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


def main():
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
