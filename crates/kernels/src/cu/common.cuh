// Shared device helpers: bf16 conversion and deterministic block reductions.
// Reductions use a fixed tree (warp butterfly, then one warp over the warp
// partials), so a result depends only on the inputs, never on scheduling.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
__device__ __forceinline__ unsigned warp_sum_u32(unsigned v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reductions; every thread of the block must call them (blockDim a
// multiple of 32, at most 1024). `scratch` holds 32 values; the result is
// returned to every thread.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.f;
    v = warp_sum(v);
    return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    v = warp_max(v);
    return v;
}
__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v, unsigned long long* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max_u64(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0ull;
    v = warp_max_u64(v);
    return v;
}
__device__ __forceinline__ unsigned block_sum_u32(unsigned v, unsigned* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_u32(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0u;
    v = warp_sum_u32(v);
    return v;
}

// Physical KV slot of position `pos` of a sequence with block table `table`.
__device__ __forceinline__ size_t kv_slot(const uint32_t* table, uint32_t pos, uint32_t block_size) {
    return (size_t)table[pos / block_size] * block_size + pos % block_size;
}

// The first position a query at `pos` sees under a sliding window of
// `window` keys (itself and the window - 1 before it; 0: no window): the
// kernels' copy of ops::attention::ScoreRule::first (the attention tests
// hold every kernel to that rule).
__device__ __forceinline__ uint32_t window_first(uint32_t pos, uint32_t window) {
    return window != 0 && pos + 1 > window ? pos + 1 - window : 0;
}

// Eight bf16 (one 16-byte load) widened to f32.
__device__ __forceinline__ void bf8(const uint4 raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
