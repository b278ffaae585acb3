// Embedding gather and row gather.
// embedding_gather: out[t, :] (f32 residual stream) = table[ids[t], :] (bf16).
//   grid = T blocks, block = 256 threads; ids >= vocab (rejected on the host)
//   produce NaN rows so such a bug cannot pass silently.
// gather_rows_bf16: out[r, :] = src[rows[r], :], both bf16 [*, width]; used to
//   pick the rows to sample before the LM head.
#include "common.cuh"

extern "C" __global__ void embedding_gather(float* __restrict__ out,            // [T, hidden]
                                            const bf16* __restrict__ table,     // [vocab, hidden]
                                            const uint32_t* __restrict__ ids,   // [T]
                                            uint32_t hidden, uint32_t vocab) {
    uint32_t t = blockIdx.x;
    uint32_t id = ids[t];
    float* o = out + (size_t)t * hidden;
    if (id >= vocab) {
        for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
        return;
    }
    const bf16* row = table + (size_t)id * hidden;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = bf2f(row[i]);
}

extern "C" __global__ void gather_rows_bf16(bf16* __restrict__ out,               // [R, width]
                                            const bf16* __restrict__ src,         // [T, width]
                                            const uint32_t* __restrict__ rows,    // [R]
                                            uint32_t width, uint32_t num_src_rows) {
    uint32_t r = blockIdx.x;
    uint32_t s = rows[r];
    bf16* o = out + (size_t)r * width;
    if (s >= num_src_rows) {
        for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = f2bf(__int_as_float(0x7fc00000));
        return;
    }
    const bf16* in = src + (size_t)s * width;
    for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = in[i];
}
