// RoPE then the orthonormal Walsh-Hadamard rotation of one attention head,
// by one warp, in registers: what an FP8 K/V cache at calibrated K scales
// applies to q and k heads (src/kv.rs; ops::hadamard::rotate_heads, the
// same f32 operations: butterflies of distance 1, 2, .., D/2 in that order,
// (x, y) -> (x + y, x - y), then the factor 1 / sqrt(D)).
// Layout: lane l holds elements l + 32 e of the head (e < max(1, D / 32));
// with D < 32 lanes >= D hold nothing, and since every shuffle distance is
// below D their shuffles stay among themselves. D is a power of two,
// 2..=LAMINA_HADAMARD_MAX_DIM (checked on the host). Butterflies of
// distance below 32 are shuffles, the others pair a lane's own registers.
#pragma once

#include "common.cuh"
#include "kv.cuh"
#include "lamina_consts.cuh"

// Registers of a head per lane.
constexpr int HADAMARD_SLOTS = LAMINA_HADAMARD_MAX_DIM / 32;

// The lane's elements of head `src` (D bf16 values; zeros past D). Loads
// through L2 (ld.cg): the head may have been written by other blocks of the
// same launch.
__device__ __forceinline__ void hadamard_load(const bf16* src, uint32_t D, float (&v)[HADAMARD_SLOTS]) {
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < HADAMARD_SLOTS; e++) {
        const uint32_t i = lane + 32u * e;
        v[e] = i < D ? bf2f(__ldcg(src + i)) : 0.f;
    }
}

// RoPE (rotate-half) of the head in v at one position's table rows c, s
// ([D/2] each); whole warp. Element i pairs with i ^ D/2: the lower one
// becomes x c - y s, the upper y c + x s (ops::rope).
__device__ __forceinline__ void hadamard_rope(float (&v)[HADAMARD_SLOTS], uint32_t D, const float* c,
                                              const float* s) {
    const uint32_t lane = threadIdx.x & 31, half = D / 2;
    float p[HADAMARD_SLOTS];
#pragma unroll
    for (int e = 0; e < HADAMARD_SLOTS; e++) p[e] = __shfl_xor_sync(0xffffffffu, v[e], half < 32 ? half : 0);
#pragma unroll
    for (int H = 1; H < HADAMARD_SLOTS; H *= 2)
        if (half == 32u * H) {
#pragma unroll
            for (int e = 0; e < HADAMARD_SLOTS; e++) p[e] = v[e ^ H];
        }
#pragma unroll
    for (int e = 0; e < HADAMARD_SLOTS; e++) {
        const uint32_t i = lane + 32u * e;
        if (i < D) {
            const uint32_t j = i & (half - 1);
            v[e] = i < half ? v[e] * c[j] - p[e] * s[j] : v[e] * c[j] + p[e] * s[j];
        }
    }
}

// The orthonormal Hadamard rotation of the head in v; whole warp.
__device__ __forceinline__ void hadamard_rotate(float (&v)[HADAMARD_SLOTS], uint32_t D) {
    const uint32_t lane = threadIdx.x & 31;
    for (uint32_t h = 1; h < D && h < 32; h *= 2) {
#pragma unroll
        for (int e = 0; e < HADAMARD_SLOTS; e++) {
            const float t = __shfl_xor_sync(0xffffffffu, v[e], h);
            v[e] = (lane & h) ? t - v[e] : v[e] + t;
        }
    }
#pragma unroll
    for (int H = 1; H < HADAMARD_SLOTS; H *= 2)
        if (32u * H < D) {
#pragma unroll
            for (int e = 0; e < HADAMARD_SLOTS; e++)
                if (!(e & H)) {
                    const float x = v[e], y = v[e | H];
                    v[e] = x + y;
                    v[e | H] = x - y;
                }
        }
    const float norm = 1.f / sqrtf((float)D);
#pragma unroll
    for (int e = 0; e < HADAMARD_SLOTS; e++) v[e] *= norm;
}

// Stores the lane's elements of a rotated head: a q head as bf16 at `q`
// (k == nullptr), or a k head into the cache at element `k_at` of `k`
// (kv.cuh's codec: bf16, or e4m3 at `k_scale` when `fp8`).
__device__ __forceinline__ void hadamard_store(const float (&v)[HADAMARD_SLOTS], uint32_t D, bf16* q, void* k,
                                               size_t k_at, bool fp8, float k_scale) {
    const uint32_t lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < HADAMARD_SLOTS; e++) {
        const uint32_t i = lane + 32u * e;
        if (i >= D) continue;
        if (k == nullptr)
            q[i] = f2bf(v[e]);
        else
            kv_store(k, k_at + i, v[e], fp8, k_scale);
    }
}
