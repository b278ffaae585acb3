// The LoRA form of the GEMVs (the LoRA paragraph of gemv.cu's module doc):
// the shrink blocks, the GEMV blocks' wait for them and the delta of a
// weight row; included by gemv.cu only, after its GemvIn enum.
#pragma once

#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

// The LoRA delta of weight row c for token row r on slot s >= 1.
__device__ __forceinline__ float gemv_lora_delta(const GemvArgs& a, uint32_t r, uint32_t s, uint32_t c) {
    const uint32_t seg = c >= a.lora_seg2 ? 2 : (c >= a.lora_seg1 ? 1 : 0);
    const float* __restrict__ h = a.lora_h + (size_t)r * a.lora_hw + seg * a.lora_rank;
    const bf16* __restrict__ b = a.lora_b + ((size_t)c * a.lora_slots + (s - 1)) * a.lora_hw + seg * a.lora_rank;
    float acc = 0.f;
    for (uint32_t i = 0; i < a.lora_rank; i += 8) {
        float bf[8];
        bf8(*reinterpret_cast<const uint4*>(b + i), bf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(h[i + e], bf[e], acc);
    }
    return a.lora_scales[s - 1] * acc;
}

// Chunks of 8 columns of an A row each lane of a shrink block requests
// before the PDL wait (the whole row for K <= 2048).
#define GEMV_LORA_REGS 8

// Adds input columns c..c+8 of row t times the A chunk `wr` to `acc` (the
// residual through norm_w for IN_NORM, its squares then added to `ss`).
template <int IN>
__device__ __forceinline__ void gemv_lora_dot(const GemvArgs& a, uint32_t t, uint32_t c, const uint4 wr,
                                              float& acc, float& ss) {
    float wf[8], xf[8];
    bf8(wr, wf);
    if (IN == IN_NORM) {
        const float* x = static_cast<const float*>(a.x) + (size_t)t * a.k + c;
        const float4 x0 = *reinterpret_cast<const float4*>(x);
        const float4 x1 = *reinterpret_cast<const float4*>(x + 4);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float gf[8];
        bf8(*reinterpret_cast<const uint4*>(a.norm_w + c), gf);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ss = fmaf(xs[e], xs[e], ss);
            xf[e] = xs[e] * gf[e];
        }
    } else {
        bf8(*reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.x) + (size_t)t * a.k + c), xf);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) acc = fmaf(xf[e], wf[e], acc);
}

// A shrink block (module doc): row t, columns `blk % per_row * GEMV_WARPS + warp` of h.
template <int IN>
__device__ __forceinline__ void gemv_lora_shrink(const GemvArgs& a, uint32_t blk) {
    const uint32_t per_row = (a.lora_hw + LAMINA_GEMV_WARPS - 1) / LAMINA_GEMV_WARPS;
    const uint32_t t = blk / per_row, warp = threadIdx.x / 32, lane = threadIdx.x % 32, k = a.k;
    const uint32_t j = blk % per_row * LAMINA_GEMV_WARPS + warp;
    const uint32_t s = ld_before_wait_u32(a.lora_slot_of + t);
    const bool on = s != 0 && s <= a.lora_slots && j < a.lora_hw;
    const bf16* __restrict__ w = a.lora_a + ((size_t)(on ? s - 1 : 0) * a.lora_hw + (on ? j : 0)) * k;
    uint4 wv[GEMV_LORA_REGS];
#pragma unroll
    for (int u = 0; u < GEMV_LORA_REGS; u++) {
        const uint32_t c = lane * 8 + u * 256;
        wv[u] = on && c < k ? ld_before_wait(w + c) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    if (on) {
        float acc = 0.f, ss = 0.f;
#pragma unroll
        for (int u = 0; u < GEMV_LORA_REGS; u++) {
            const uint32_t c = lane * 8 + u * 256;
            if (c < k) gemv_lora_dot<IN>(a, t, c, wv[u], acc, ss);
        }
        for (uint32_t c = lane * 8 + GEMV_LORA_REGS * 256; c < k; c += 256)
            gemv_lora_dot<IN>(a, t, c, *reinterpret_cast<const uint4*>(w + c), acc, ss);
        acc = warp_sum(acc);
        if (IN == IN_NORM) acc *= rsqrtf(warp_sum(ss) / (float)k + a.eps);
        if (lane == 0) a.lora_h[(size_t)t * a.lora_hw + j] = acc;
    }
    // release h before the count (the waiting blocks acquire it)
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(a.lora_ready, 1u);
}

// Waits until every shrink block has written its columns of h.
__device__ __forceinline__ void gemv_lora_wait(const GemvArgs& a) {
    uint32_t n;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(a.lora_ready) : "memory");
    } while (n < a.lora_shrink_blocks);
}
