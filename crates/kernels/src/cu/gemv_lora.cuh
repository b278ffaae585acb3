// The LoRA part of the GEMVs (the LoRA paragraph of gemv.cu's module doc):
// the shrink blocks, the GEMV blocks' wait for them and the deltas of a
// warp's weight rows; included by gemv.cu only, after its GemvIn enum.
// Every entry point carries it, taken when the launch has adapter slots
// (`lora_slots != 0`); the shrink and the delta are out-of-line functions,
// one copy each for every format, variant and row tile.
#pragma once

#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

// The fields of GemvArgs the LoRA code reads, passed by value: a kernel
// parameter whose address reached an out-of-line call would be copied to
// local memory on every launch, plain ones included.
struct LoraView {
    const void* x;           // the launch's input (bf16 rows, or the f32 residual for IN_NORM)
    const bf16* norm_w;      // [k]
    const bf16* wa;          // A: [slots, hw, k]
    const bf16* wb;          // B: [weight rows, slots, hw]
    float* h;                // [m, hw]
    uint32_t* ready;         // shrink blocks done
    const float* scales;     // [slots]
    const uint32_t* slot_of; // [m]
    uint32_t k, rank, hw, seg1, seg2, slots, shrink_blocks;
    float eps, norm_offset;
};

__device__ __forceinline__ LoraView lora_view(const GemvArgs& a) {
    return LoraView{a.x,         a.norm_w,  a.lora_a,    a.lora_b,    a.lora_h,     a.lora_ready,
                    a.lora_scales, a.lora_slot_of, a.k,  a.lora_rank, a.lora_hw,    a.lora_seg1,
                    a.lora_seg2, a.lora_slots, a.lora_shrink_blocks, a.eps,         a.norm_offset};
}

// The LoRA delta of weight row c for token row r on slot s >= 1.
__device__ __forceinline__ float gemv_lora_delta1(const LoraView& l, uint32_t r, uint32_t s, uint32_t c) {
    const uint32_t seg = c >= l.seg2 ? 2 : (c >= l.seg1 ? 1 : 0);
    const float* __restrict__ h = l.h + (size_t)r * l.hw + seg * l.rank;
    const bf16* __restrict__ b = l.wb + ((size_t)c * l.slots + (s - 1)) * l.hw + seg * l.rank;
    float acc = 0.f;
    for (uint32_t i = 0; i < l.rank; i += 8) {
        float bf[8];
        bf8(*reinterpret_cast<const uint4*>(b + i), bf);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(h[i + e], bf[e], acc);
    }
    return l.scales[s - 1] * acc;
}

// Waits until every shrink block has written its columns of h, then the
// deltas of weight rows c0 and (when ok1) c1 for token row r on slot s >= 1.
__device__ __noinline__ float2 gemv_lora_deltas(const LoraView l, uint32_t r, uint32_t s, uint32_t c0, uint32_t c1,
                                                bool ok1) {
    uint32_t n;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(l.ready) : "memory");
    } while (n < l.shrink_blocks);
    return make_float2(gemv_lora_delta1(l, r, s, c0), ok1 ? gemv_lora_delta1(l, r, s, c1) : 0.f);
}

// Chunks of 8 columns of an A row each lane of a shrink block requests
// before the PDL wait (the whole row for K <= 2048).
#define GEMV_LORA_REGS 8

// Adds input columns c..c+8 of row t times the A chunk `wr` to `acc` (the
// residual through norm_w for IN_NORM, its squares then added to `ss`).
template <int IN>
__device__ __forceinline__ void gemv_lora_dot(const LoraView& l, uint32_t t, uint32_t c, const uint4 wr,
                                              float& acc, float& ss) {
    float wf[8], xf[8];
    bf8(wr, wf);
    if (IN == IN_NORM) {
        const float* x = static_cast<const float*>(l.x) + (size_t)t * l.k + c;
        const float4 x0 = *reinterpret_cast<const float4*>(x);
        const float4 x1 = *reinterpret_cast<const float4*>(x + 4);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float gf[8];
        bf8(*reinterpret_cast<const uint4*>(l.norm_w + c), gf);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ss = fmaf(xs[e], xs[e], ss);
            xf[e] = xs[e] * (l.norm_offset + gf[e]);
        }
    } else {
        bf8(*reinterpret_cast<const uint4*>(static_cast<const bf16*>(l.x) + (size_t)t * l.k + c), xf);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) acc = fmaf(xf[e], wf[e], acc);
}

// A shrink block (module doc): row t, columns `blk % per_row * GEMV_WARPS + warp` of h.
template <int IN>
__device__ __noinline__ void gemv_lora_shrink(const LoraView l, uint32_t blk) {
    const uint32_t per_row = (l.hw + LAMINA_GEMV_WARPS - 1) / LAMINA_GEMV_WARPS;
    const uint32_t t = blk / per_row, warp = threadIdx.x / 32, lane = threadIdx.x % 32, k = l.k;
    const uint32_t j = blk % per_row * LAMINA_GEMV_WARPS + warp;
    const uint32_t s = ld_before_wait_u32(l.slot_of + t);
    const bool on = s != 0 && s <= l.slots && j < l.hw;
    const bf16* __restrict__ w = l.wa + ((size_t)(on ? s - 1 : 0) * l.hw + (on ? j : 0)) * k;
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
            if (c < k) gemv_lora_dot<IN>(l, t, c, wv[u], acc, ss);
        }
        for (uint32_t c = lane * 8 + GEMV_LORA_REGS * 256; c < k; c += 256)
            gemv_lora_dot<IN>(l, t, c, *reinterpret_cast<const uint4*>(w + c), acc, ss);
        acc = warp_sum(acc);
        if (IN == IN_NORM) acc *= rsqrtf(warp_sum(ss) / (float)k + l.eps);
        if (lane == 0) l.h[(size_t)t * l.hw + j] = acc;
    }
    // release h before the count (the waiting blocks acquire it)
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(l.ready, 1u);
}
