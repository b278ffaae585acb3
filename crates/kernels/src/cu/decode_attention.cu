// Decode attention: one query token per sequence, paged, GQA-aware, split
// over the KV length (flash-decoding) with a combine step.
//
// decode_attention_dD: grid (max_splits, S, n_kv), block 128 threads, dynamic
//   shared memory (G*D + G*chunk + 2G) floats. Block (split, s, kvh) handles
//   keys [split*chunk, min(ctx, (split+1)*chunk)) for the G query heads of KV
//   head kvh: each key row is loaded once for all G heads (scores), each value
//   element once for all of a thread's heads (PV). Splits past the context
//   exit at once, so the grid can be sized for the longest context a graph
//   may meet. Writes un-normalised partial outputs and (max, sum) per split.
// decode_combine: grid (S, n_heads), block >= 32 threads: merges the
//   ceil(ctx / chunk) partials of each head into out[s, head*D + d] (bf16).
#include "common.cuh"

#define DECODE_THREADS 128
#define DECODE_MAX_HEADS_PER_THREAD 16

template <int D>
__device__ __forceinline__ void decode_attention_impl(
    const bf16* __restrict__ qkv,              // [S, (n_heads + 2 n_kv) D], q roped
    const bf16* __restrict__ k_cache,          // [slots, n_kv, D]
    const bf16* __restrict__ v_cache,          // [slots, n_kv, D]
    const uint32_t* __restrict__ context_lens, // [S]
    const uint32_t* __restrict__ block_tables, // [S, max_blocks]
    float* __restrict__ part_o,                // [S, n_heads, max_splits, D]
    float* __restrict__ part_ml,               // [S, n_heads, max_splits, 2]
    uint32_t max_blocks, uint32_t n_heads, uint32_t n_kv, uint32_t block_size, uint32_t chunk,
    uint32_t max_splits, float scale) {
    extern __shared__ float smem[];
    const uint32_t G = n_heads / n_kv;
    const uint32_t split = blockIdx.x, s = blockIdx.y, kvh = blockIdx.z;
    const uint32_t ctx = context_lens[s];
    const uint32_t start = split * chunk;
    if (start >= ctx) return;  // uniform over the block
    const uint32_t n = min(chunk, ctx - start);
    float* q_s = smem;            // [G, D]
    float* sc = q_s + G * D;      // [G, chunk]
    float* ml = sc + G * chunk;   // [G, 2]
    const size_t row_stride = (size_t)(n_heads + 2 * n_kv) * D;
    const uint32_t* table = block_tables + (size_t)s * max_blocks;

    for (uint32_t e = threadIdx.x; e < G * D; e += blockDim.x)
        q_s[e] = bf2f(qkv[s * row_stride + (size_t)kvh * G * D + e]) * scale;
    __syncthreads();

    for (uint32_t jj = threadIdx.x; jj < n; jj += blockDim.x) {
        const bf16* kr = k_cache + (kv_slot(table, start + jj, block_size) * n_kv + kvh) * D;
        float k[D];
        const uint4* kv4 = reinterpret_cast<const uint4*>(kr);
#pragma unroll
        for (int c = 0; c < D / 8; c++) {
            uint4 raw = kv4[c];
            const bf16* h = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
            for (int i = 0; i < 8; i++) k[c * 8 + i] = bf2f(h[i]);
        }
        for (uint32_t g = 0; g < G; g++) {
            float dot = 0.f;
#pragma unroll
            for (int d = 0; d < D; d++) dot += q_s[g * D + d] * k[d];
            sc[g * chunk + jj] = dot;
        }
    }
    __syncthreads();

    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (uint32_t g = warp; g < G; g += nwarps) {
        float mx = -INFINITY;
        for (uint32_t j = lane; j < n; j += 32) mx = fmaxf(mx, sc[g * chunk + j]);
        mx = warp_max(mx);
        float sum = 0.f;
        for (uint32_t j = lane; j < n; j += 32) {
            float p = __expf(sc[g * chunk + j] - mx);
            sc[g * chunk + j] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            ml[2 * g] = mx;
            ml[2 * g + 1] = sum;
        }
    }
    __syncthreads();

    const uint32_t d = threadIdx.x % D, g0 = threadIdx.x / D, step = blockDim.x / D;
    float acc[DECODE_MAX_HEADS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < DECODE_MAX_HEADS_PER_THREAD; i++) acc[i] = 0.f;
    for (uint32_t jj = 0; jj < n; jj++) {
        const float vv = bf2f(v_cache[(kv_slot(table, start + jj, block_size) * n_kv + kvh) * D + d]);
#pragma unroll
        for (int i = 0; i < DECODE_MAX_HEADS_PER_THREAD; i++) {
            const uint32_t g = g0 + i * step;
            if (g < G) acc[i] += sc[g * chunk + jj] * vv;
        }
    }
#pragma unroll
    for (int i = 0; i < DECODE_MAX_HEADS_PER_THREAD; i++) {
        const uint32_t g = g0 + i * step;
        if (g < G) {
            const size_t idx = ((size_t)s * n_heads + kvh * G + g) * max_splits + split;
            part_o[idx * D + d] = acc[i];
            if (d == 0) {
                part_ml[idx * 2] = ml[2 * g];
                part_ml[idx * 2 + 1] = ml[2 * g + 1];
            }
        }
    }
}

#define DECODE_ATTENTION(D)                                                                                  \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS) decode_attention_d##D(                     \
        const bf16* qkv, const bf16* k_cache, const bf16* v_cache, const uint32_t* context_lens,             \
        const uint32_t* block_tables, float* part_o, float* part_ml, uint32_t max_blocks, uint32_t n_heads, \
        uint32_t n_kv, uint32_t block_size, uint32_t chunk, uint32_t max_splits, float scale) {             \
        decode_attention_impl<D>(qkv, k_cache, v_cache, context_lens, block_tables, part_o, part_ml,         \
                                 max_blocks, n_heads, n_kv, block_size, chunk, max_splits, scale);           \
    }
DECODE_ATTENTION(16)
DECODE_ATTENTION(32)
DECODE_ATTENTION(64)
DECODE_ATTENTION(128)

extern "C" __global__ void decode_combine(const float* __restrict__ part_o,         // [S, n_heads, max_splits, D]
                                          const float* __restrict__ part_ml,        // [S, n_heads, max_splits, 2]
                                          const uint32_t* __restrict__ context_lens, // [S]
                                          bf16* __restrict__ out,                   // [S, n_heads D]
                                          uint32_t n_heads, uint32_t head_dim, uint32_t chunk, uint32_t max_splits) {
    const uint32_t s = blockIdx.x, h = blockIdx.y;
    const uint32_t ctx = context_lens[s];
    const uint32_t ns = min((ctx + chunk - 1) / chunk, max_splits);
    const size_t base = ((size_t)s * n_heads + h) * max_splits;
    float M = -INFINITY;
    for (uint32_t i = 0; i < ns; i++) M = fmaxf(M, part_ml[(base + i) * 2]);
    float L = 0.f;
    for (uint32_t i = 0; i < ns; i++) L += part_ml[(base + i) * 2 + 1] * __expf(part_ml[(base + i) * 2] - M);
    const float inv = 1.f / L;
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.f;
        for (uint32_t i = 0; i < ns; i++) o += part_o[(base + i) * head_dim + d] * __expf(part_ml[(base + i) * 2] - M);
        out[(size_t)s * n_heads * head_dim + (size_t)h * head_dim + d] = f2bf(o * inv);
    }
}
