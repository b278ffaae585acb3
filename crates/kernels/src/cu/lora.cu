// LoRA deltas of many adapters in one step (BGMV): each token row names its
// adapter slot in a device table (`slot_of`: 0 the base model, `s` slot
// `s - 1`), so the launches are the same whatever rows use which adapter
// and a captured graph replays them with a new table.
//
// lora_shrink:  h[t, j] = x[t, :] . A[slot(t), j, :]         (f32 accumulate)
// lora_expand:  y[t, c] += scale[slot(t)] * h[t, seg(c) r .. seg(c) r + r] . B[slot(t), c, :]
//
// A of a fused projection stacks each target's rows (q, k, v or gate, up:
// `segments x rank` rows), so one shrink serves the inputs they share; the
// expand's output column `c` reads the `h` segment of the target it belongs
// to (`seg1`, `seg2`: the first columns of segments 1 and 2). Ranks are
// padded with zero rows of A and zero columns of B to a multiple of
// LAMINA_LORA_RANK_STEP. Base rows (slot 0) and slots past `slots` return
// at once: they read and write nothing.
//
// Shrink: block (row t, LAMINA_LORA_SHRINK_WARPS columns of h), one warp per
// column, 16-byte loads of x and A (k a multiple of 8, operands 16-byte
// aligned: the launcher checks). Expand: block (row t, LAMINA_LORA_EXPAND_THREADS
// columns of y), one thread per column, B rows read as 16-byte vectors.
//
// lora_fused: both in one launch for a few rows (the decode GEMV steps):
// block (row t, LAMINA_LORA_FUSED_THREADS columns of y); every block
// computes the row's whole `h` (at most LAMINA_LORA_FUSED_MAX_H values) into
// shared memory, its warps one column each in turn, then its threads one
// output column each. The input is bf16 rows, or the f32 residual stream
// with the RMSNorm weight `norm_w` applied first (the input of Q/K/V and
// gate/up in the GEMV path, which never materialises the normed rows); the
// output bf16 or f32 (`y_f32`: the residual stream). Launched with
// programmatic dependent launch: it waits before reading anything.
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

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

__device__ __forceinline__ void add_to(bf16* y, float d) { *y = f2bf(bf2f(*y) + d); }
__device__ __forceinline__ void add_to(float* y, float d) { *y += d; }

template <typename T>
__device__ __forceinline__ void lora_expand(const LoraExpandArgs& a) {
    const uint32_t t = blockIdx.x;
    const uint32_t s = a.slot_of[t];
    if (s == 0 || s > a.slots) return;
    const uint32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= a.n) return;
    const uint32_t seg = c >= a.seg2 ? 2 : (c >= a.seg1 ? 1 : 0);
    const float* __restrict__ h = a.h + (size_t)t * a.hw + seg * a.rank;      // [rank]
    const bf16* __restrict__ b = a.b + ((size_t)(s - 1) * a.n + c) * a.rank;  // [rank]
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
    T* y = reinterpret_cast<T*>(a.y) + (size_t)t * a.n + c;
    add_to(y, a.scales[s - 1] * acc);
}

extern "C" __global__ void lora_expand_bf16(const LoraExpandArgs a) { lora_expand<bf16>(a); }
extern "C" __global__ void lora_expand_f32(const LoraExpandArgs a) { lora_expand<float>(a); }

// x[c..c+8] * A[c..c+8] for a bf16 row.
__device__ __forceinline__ float dot8(const bf16* x, const bf16* w) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x);
    const uint4 wv = *reinterpret_cast<const uint4*>(w);
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 xf = __bfloat1622float2(xp[e]), wf = __bfloat1622float2(wp[e]);
        acc = fmaf(xf.x, wf.x, acc);
        acc = fmaf(xf.y, wf.y, acc);
    }
    return acc;
}

// (x[c..c+8] * g[c..c+8]) * A[c..c+8] for an f32 row and a bf16 norm weight.
__device__ __forceinline__ float dot8_norm(const float* x, const bf16* g, const bf16* w) {
    const float4 x0 = *reinterpret_cast<const float4*>(x);
    const float4 x1 = *reinterpret_cast<const float4*>(x + 4);
    const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const uint4 gv = *reinterpret_cast<const uint4*>(g);
    const uint4 wv = *reinterpret_cast<const uint4*>(w);
    const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
    float acc = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 gf = __bfloat1622float2(gp[e]), wf = __bfloat1622float2(wp[e]);
        acc = fmaf(xs[2 * e] * gf.x, wf.x, acc);
        acc = fmaf(xs[2 * e + 1] * gf.y, wf.y, acc);
    }
    return acc;
}

extern "C" __global__ void lora_fused(const LoraFusedArgs a) {
    __shared__ float h[LAMINA_LORA_FUSED_MAX_H];
    __shared__ float scratch[32];
    pdl_wait();
    const uint32_t t = blockIdx.x;
    const uint32_t s = a.slot_of[t];
    if (s == 0 || s > a.slots) return;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    const uint32_t k = a.k;
    const bf16* __restrict__ g = a.norm_w;
    float rs = 1.f;
    if (g != nullptr) {
        const float* __restrict__ x = reinterpret_cast<const float*>(a.x) + (size_t)t * k;
        float ss = 0.f;
        for (uint32_t c = threadIdx.x; c < k; c += blockDim.x) ss = fmaf(x[c], x[c], ss);
        ss = block_sum(ss, scratch);
        rs = rsqrtf(ss / (float)k + a.eps);
    }
    for (uint32_t j = warp; j < a.hw; j += nw) {
        const bf16* __restrict__ w = a.a + ((size_t)(s - 1) * a.hw + j) * k;
        float acc = 0.f;
        if (g != nullptr) {
            const float* x = reinterpret_cast<const float*>(a.x) + (size_t)t * k;
            for (uint32_t c = lane * 8; c < k; c += 32 * 8) acc += dot8_norm(x + c, g + c, w + c);
        } else {
            const bf16* x = reinterpret_cast<const bf16*>(a.x) + (size_t)t * k;
            for (uint32_t c = lane * 8; c < k; c += 32 * 8) acc += dot8(x + c, w + c);
        }
        acc = warp_sum(acc);
        if (lane == 0) h[j] = acc * rs;
    }
    __syncthreads();
    const uint32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= a.n) return;
    const uint32_t seg = c >= a.seg2 ? 2 : (c >= a.seg1 ? 1 : 0);
    const float* hs = h + seg * a.rank;
    const bf16* __restrict__ b = a.b + ((size_t)(s - 1) * a.n + c) * a.rank;
    float acc = 0.f;
    for (uint32_t r = 0; r < a.rank; r += 8) {
        const uint4 bv = *reinterpret_cast<const uint4*>(b + r);
        const __nv_bfloat162* bp = reinterpret_cast<const __nv_bfloat162*>(&bv);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 bf = __bfloat1622float2(bp[e]);
            acc = fmaf(hs[r + 2 * e], bf.x, acc);
            acc = fmaf(hs[r + 2 * e + 1], bf.y, acc);
        }
    }
    const float d = a.scales[s - 1] * acc;
    if (a.y_f32) {
        add_to(reinterpret_cast<float*>(a.y) + (size_t)t * a.n + c, d);
    } else {
        add_to(reinterpret_cast<bf16*>(a.y) + (size_t)t * a.n + c, d);
    }
}
