// Embedding gather and row gather.
// embedding_gather: out[t, :] (f32 residual stream) = table[id, :] (bf16) * scale,
//   id = prev[carry[t]] when carry is given and carry[t] < num_prev (a token
//   sampled by the previous step, still on the device: pipelined steps), else
//   ids[t]. grid = T blocks, block = LAMINA_ROW_THREADS; ids >= vocab
//   (rejected on the host) produce NaN rows so such a bug cannot pass silently.
// gather_rows_bf16: out[r, :] = src[rows[r], :], both bf16 [*, width]; used to
//   pick the rows to sample before the LM head.
// Each kernel takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"

extern "C" __global__ void embedding_gather(const EmbeddingGatherArgs a) {
    float* __restrict__ out = a.out;               // [T, hidden]
    const bf16* __restrict__ table = a.table;      // [vocab, hidden]
    const uint32_t hidden = a.hidden;
    uint32_t t = blockIdx.x;
    uint32_t id = a.ids[t];
    if (a.carry != nullptr) {
        const uint32_t c = a.carry[t];
        if (c < a.num_prev) id = a.prev[c];
    }
    float* o = out + (size_t)t * hidden;
    if (id >= a.vocab) {
        for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
        return;
    }
    const bf16* row = table + (size_t)id * hidden;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = bf2f(row[i]) * a.scale;
}

extern "C" __global__ void gather_rows_bf16(const GatherRowsArgs a) {
    bf16* __restrict__ out = a.out;                // [R, width]
    const bf16* __restrict__ src = a.src;          // [num_src_rows, width]
    const uint32_t width = a.width;
    uint32_t r = blockIdx.x;
    uint32_t s = a.rows[r];
    bf16* o = out + (size_t)r * width;
    if (s >= a.num_src_rows) {
        for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = f2bf(__int_as_float(0x7fc00000));
        return;
    }
    const bf16* in = src + (size_t)s * width;
    for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = in[i];
}
