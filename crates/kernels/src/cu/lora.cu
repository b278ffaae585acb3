// LoRA deltas of many adapters in one step (BGMV): each token row names its
// adapter slot in a device table (`slot_of`: 0 the base model, `s` slot
// `s - 1`), so the launches are the same whatever rows use which adapter
// and a captured graph replays them with a new table.
//
// lora_shrink:  h[t, j] = x[t, :] . A[slot(t), j, :]         (f32 accumulate)
// lora_expand:  y[t, c] += scale[slot(t)] * h[t, seg(c) r .. seg(c) r + r] . B[c, slot(t), seg(c) r ..]
// lora_select:  hb[t, s hw + j] = slot(t) == s + 1 ? bf16(scale[s] * hw_all[t, s hw + j]) : 0
//
// A of a fused projection stacks each target's rows (q, k, v or gate, up:
// `segments x rank` rows, `hw` in all), so one shrink serves the inputs they
// share. B is one matrix `[n, slots x hw]`: row `c` holds, for each slot,
// `hw` values of which only the `rank` of the segment `c` belongs to are
// set (`seg1`, `seg2`: the first columns of segments 1 and 2), so that the
// tensor-core path is two plain GEMMs around lora_select: `hw_all = x .
// A_allᵀ` (every slot's shrink), then `y += hb . Bᵀ`, where hb keeps each
// row's own slot only. Ranks are padded with zero rows of A and zero
// columns of B to a multiple of LAMINA_LORA_RANK_STEP. Base rows (slot 0)
// and slots past `slots` contribute nothing.
//
// Shrink: block (row t, LAMINA_LORA_SHRINK_WARPS columns of h), one warp per
// column, 16-byte loads of x and A (k a multiple of 8, operands 16-byte
// aligned: the launcher checks). Expand: block (row t, LAMINA_LORA_EXPAND_THREADS
// columns of y), one thread per column, B rows read as 16-byte vectors.
// Both fix each row's reduction order whatever the batch (deterministic
// mode); the GEMM pair is faster from a few rows up.
//
// The GEMV steps (a few rows) run neither: a GEMV launch computes the
// shrink in blocks of its own and adds the expand in its epilogue
// (cu/gemv.cu).
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

extern "C" __global__ void lora_shrink(const LoraShrinkArgs a) {
    const uint32_t t = blockIdx.x;
    const uint32_t s = a.slot_of[t];
    if (s == 0 || s > a.slots) return;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t j = blockIdx.y * LAMINA_LORA_SHRINK_WARPS + warp;
    if (j >= a.n) return;
    const bf16* __restrict__ x = a.x + (size_t)t * a.k;                      // [k]
    const bf16* __restrict__ w = a.a + ((size_t)(s - 1) * a.n + j) * a.k;    // [k]
    float acc = 0.f;
    for (uint32_t c = lane * 8; c < a.k; c += 32 * 8) {
        const uint4 xv = *reinterpret_cast<const uint4*>(x + c);
        const uint4 wv = *reinterpret_cast<const uint4*>(w + c);
        const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
        const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 xf = __bfloat1622float2(xp[e]), wf = __bfloat1622float2(wp[e]);
            acc = fmaf(xf.x, wf.x, acc);
            acc = fmaf(xf.y, wf.y, acc);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) a.h[(size_t)t * a.n + j] = acc;
}

extern "C" __global__ void lora_expand(const LoraExpandArgs a) {
    const uint32_t t = blockIdx.x;
    const uint32_t s = a.slot_of[t];
    if (s == 0 || s > a.slots) return;
    const uint32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= a.n) return;
    const uint32_t seg = c >= a.seg2 ? 2 : (c >= a.seg1 ? 1 : 0);
    const float* __restrict__ h = a.h + (size_t)t * a.hw + seg * a.rank;                            // [rank]
    const bf16* __restrict__ b = a.b + ((size_t)c * a.slots + (s - 1)) * a.hw + seg * a.rank;  // [rank]
    float acc = 0.f;
    for (uint32_t r = 0; r < a.rank; r += 8) {
        const uint4 bv = *reinterpret_cast<const uint4*>(b + r);
        const __nv_bfloat162* bp = reinterpret_cast<const __nv_bfloat162*>(&bv);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 bf = __bfloat1622float2(bp[e]);
            acc = fmaf(h[r + 2 * e], bf.x, acc);
            acc = fmaf(h[r + 2 * e + 1], bf.y, acc);
        }
    }
    bf16* y = a.y + (size_t)t * a.n + c;
    *y = f2bf(bf2f(*y) + a.scales[s - 1] * acc);
}

// Grid-stride over the `tokens x slots x hw` values of hb.
extern "C" __global__ void lora_select(const LoraSelectArgs a) {
    const uint32_t width = a.slots * a.hw;
    const size_t total = (size_t)a.tokens * width;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(i / width), s = (uint32_t)(i % width) / a.hw;
        a.hb[i] = a.slot_of[t] == s + 1 ? f2bf(a.scales[s] * a.h[i]) : f2bf(0.f);
    }
}
