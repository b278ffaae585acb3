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
// Both run over tiles of LAMINA_LORA_TILE_ROWS consecutive rows, the
// loads of all rows of a tile in flight together, so a tile whose adapter
// rows share one slot (a prefill chunk's rows, or decode rows the engine
// placed together) brings each A row and each B row from L2 once for all
// its rows (L1 serves the repeats).
// Shrink: block (tile, LAMINA_LORA_SHRINK_WARPS columns of h), one warp per
// column, a dot per row of the tile, 16-byte loads of x and A (k a
// multiple of 8, operands 16-byte aligned: the launcher checks). Expand:
// block (tile, LAMINA_LORA_EXPAND_THREADS columns of y), one thread per
// column, B rows read as 16-byte vectors. Each dot adds in column order
// whatever the tile holds, so a row's result does not depend on its tile.

// lora_shrink_in: the shrink of the GEMV steps (a few rows), whose expand
// runs in the GEMV's epilogue (cu/gemv.cu): block (row t,
// LAMINA_LORA_SHRINK_WARPS columns of h), one warp per column, its A row
// requested before the PDL wait (weights; the slot table is staged before
// the step). The input is bf16 rows, or the f32 residual stream through
// the RMSNorm weight `norm_w` (the input of Q/K/V and gate/up in the GEMV
// path, which never materialises the normed rows): the warp sums the
// squares of the row in the same pass as its dot and scales the dot by the
// inverse RMS at the end.
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

#define TR LAMINA_LORA_TILE_ROWS

// The slot of row t0 + lane of a tile (0 past its rows, or for a slot
// past the pool).
__device__ __forceinline__ uint32_t tile_slot(const uint32_t* slot_of, uint32_t t0, uint32_t nr, uint32_t slots) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t s = lane < nr ? slot_of[t0 + lane] : 0;
    return s <= slots ? s : 0;
}

// acc += x[c..c+8] . w (eight widened weights)
__device__ __forceinline__ float dot8w(const bf16* x, const float* wf, float acc) {
    float xf[8];
    bf8(*reinterpret_cast<const uint4*>(x), xf);
#pragma unroll
    for (int e = 0; e < 8; e++) acc = fmaf(xf[e], wf[e], acc);
    return acc;
}

extern "C" __global__ void lora_shrink(const LoraShrinkArgs a) {
    const uint32_t t0 = blockIdx.x * TR, nr = min((uint32_t)TR, a.tokens - t0);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t j = blockIdx.y * LAMINA_LORA_SHRINK_WARPS + warp, k = a.k;
    const uint32_t mine = tile_slot(a.slot_of, t0, nr, a.slots);
    if (__ballot_sync(0xffffffffu, mine != 0) == 0 || j >= a.n) return;
    // each row's A row (the same one for the rows of a slot: L1 serves the
    // repeats), every row's chunk c in flight together
    const bf16* w[TR];
    float acc[TR];
#pragma unroll
    for (int r = 0; r < TR; r++) {
        const uint32_t s = __shfl_sync(0xffffffffu, mine, r);
        w[r] = s != 0 ? a.a + ((size_t)(s - 1) * a.n + j) * k : nullptr;
        acc[r] = 0.f;
    }
    const bf16* __restrict__ x = a.x + (size_t)t0 * k;
    for (uint32_t c = lane * 8; c < k; c += 256) {
#pragma unroll
        for (int r = 0; r < TR; r++) {
            if (w[r] == nullptr) continue;
            float wf[8];
            bf8(*reinterpret_cast<const uint4*>(w[r] + c), wf);
            acc[r] = dot8w(x + (size_t)r * k + c, wf, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < TR; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && w[r] != nullptr) a.h[(size_t)(t0 + r) * a.n + j] = v;
    }
}

__device__ __forceinline__ void add_to(bf16* y, float d) { *y = f2bf(bf2f(*y) + d); }
__device__ __forceinline__ void add_to(float* y, float d) { *y += d; }

template <typename T>
__device__ __forceinline__ void lora_expand(const LoraExpandArgs& a) {
    __shared__ uint32_t tile[TR];  // each row's slot
    const uint32_t t0 = blockIdx.x * TR, nr = min((uint32_t)TR, a.tokens - t0);
    if (threadIdx.x < 32) {
        const uint32_t s = tile_slot(a.slot_of, t0, nr, a.slots);
        if (threadIdx.x < TR) tile[threadIdx.x] = s;
    }
    __syncthreads();
    const uint32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= a.n) return;
    const uint32_t seg = c >= a.seg2 ? 2 : (c >= a.seg1 ? 1 : 0);
    const float* __restrict__ h = a.h + (size_t)t0 * a.hw + seg * a.rank;  // row r: + r * hw
    // each row's B row (shared by the rows of a slot), all rows' chunk i together
    const bf16* b[TR];
    float acc[TR];
#pragma unroll
    for (int r = 0; r < TR; r++) {
        const uint32_t s = tile[r];
        b[r] = s != 0 ? a.b + ((size_t)(s - 1) * a.n + c) * a.rank : nullptr;
        acc[r] = 0.f;
    }
    for (uint32_t i = 0; i < a.rank; i += 8) {
#pragma unroll
        for (int r = 0; r < TR; r++) {
            if (b[r] == nullptr) continue;
            float bf[8];
            bf8(*reinterpret_cast<const uint4*>(b[r] + i), bf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r] = fmaf(h[(size_t)r * a.hw + i + e], bf[e], acc[r]);
        }
    }
    T* y = reinterpret_cast<T*>(a.y) + (size_t)t0 * a.n + c;
#pragma unroll
    for (int r = 0; r < TR; r++)
        if (b[r] != nullptr) add_to(y + (size_t)r * a.n, a.scales[tile[r] - 1] * acc[r]);
}

extern "C" __global__ void lora_expand_bf16(const LoraExpandArgs a) { lora_expand<bf16>(a); }
extern "C" __global__ void lora_expand_f32(const LoraExpandArgs a) { lora_expand<float>(a); }

// Chunks of 8 columns of an A row each lane of `lora_shrink_in` requests
// before the PDL wait (the whole row for k <= 2048).
#define LORA_SHRINK_IN_REGS 8

// Adds input columns c..c+8 of row t times the A chunk `wr` to `acc` (the
// input through norm_w when set, its squares then added to `ss`).
__device__ __forceinline__ void lora_in_dot(const LoraShrinkInArgs& a, uint32_t t, uint32_t c, const uint4 wr,
                                            float& acc, float& ss) {
    float wf[8], xf[8];
    bf8(wr, wf);
    if (a.norm_w != nullptr) {
        const float* x = reinterpret_cast<const float*>(a.x) + (size_t)t * a.k + c;
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
        bf8(*reinterpret_cast<const uint4*>(reinterpret_cast<const bf16*>(a.x) + (size_t)t * a.k + c), xf);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) acc = fmaf(xf[e], wf[e], acc);
}

extern "C" __global__ void lora_shrink_in(const LoraShrinkInArgs a) {
    const uint32_t t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t j = blockIdx.y * LAMINA_LORA_SHRINK_WARPS + warp, k = a.k;
    const uint32_t s = ld_before_wait_u32(a.slot_of + t);
    const bool on = s != 0 && s <= a.slots && j < a.hw;
    const bf16* __restrict__ w = a.a + ((size_t)(on ? s - 1 : 0) * a.hw + (on ? j : 0)) * k;
    uint4 wv[LORA_SHRINK_IN_REGS];
#pragma unroll
    for (int u = 0; u < LORA_SHRINK_IN_REGS; u++) {
        const uint32_t c = lane * 8 + u * 256;
        wv[u] = on && c < k ? ld_before_wait(w + c) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    if (!on) return;
    float acc = 0.f, ss = 0.f;
#pragma unroll
    for (int u = 0; u < LORA_SHRINK_IN_REGS; u++) {
        const uint32_t c = lane * 8 + u * 256;
        if (c < k) lora_in_dot(a, t, c, wv[u], acc, ss);
    }
    for (uint32_t c = lane * 8 + LORA_SHRINK_IN_REGS * 256; c < k; c += 256)
        lora_in_dot(a, t, c, *reinterpret_cast<const uint4*>(w + c), acc, ss);
    acc = warp_sum(acc);
    if (a.norm_w != nullptr) acc *= rsqrtf(warp_sum(ss) / (float)k + a.eps);
    if (lane == 0) a.h[(size_t)t * a.hw + j] = acc;
}
