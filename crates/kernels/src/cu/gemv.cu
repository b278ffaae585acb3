// GEMV-shaped projections for small steps (m <= LAMINA_GEMV_MAX_ROWS token rows):
// y[m, n] = x[m, K] · W[n, K]ᵀ with bf16 weights (nn.Linear, row-major),
// fp32 accumulation, every weight row read once for all m rows.
// FP8 weights (the gemv8_* entries, format FmtFp8Row): W holds e4m3 bytes and w_side one
// f32 scale per weight row; a lane's 16-byte chunk then holds 16 columns
// instead of 8 (half as many chunks a pass; K % 16 == 0), widened to f32 in
// registers (hardware cvt on sm_89+), and each row's dot is multiplied by
// its scale before the epilogue: y = (x · q) * s, with the bf16 path's
// rounding after.
// GGUF block weights (gemv_q8_0_*, gemv_q4_0_*, gemv_q4_1_*, gemv_q4_k_*,
// gemv_q5_k_*, gemv_q6_k_*, and the int4 format's gemv_int4_*; cu/gemv_formats.cuh): a chunk holds 16 int8 or
// 32 4-bit codes, widened with the scales of their block, which w_side
// holds beside the chunks and which are loaded with them; K a multiple of
// the block (32, or 256 for the K formats). Every fusion below is the same
// for every format: only the chunk's widening differs.
//
// Grid ceil(pairs / (LAMINA_GEMV_WARPS / ksplit)) blocks of LAMINA_GEMV_WARPS warps. A warp
// owns a pair of weight rows and one of `ksplit` (1, 2 or 4, from the host)
// equal column ranges of them; the ksplit warps of a pair sit in one block
// and add their dots in shared memory in split order (deterministic). Each
// lane holds lamina_gemv_chunks<MT, NORM> 16-byte chunks of both rows in registers:
// the whole range when it is at most 256 * chunks columns (every Llama-1B
// projection at m = 1), so a warp's weight bytes are all in flight at once,
// and they are requested before the PDL wait, overlapping the previous
// kernel's tail. Requires K % 8 == 0 (16-byte aligned rows; FP8: K % 16 == 0).
//
// Variants (template flags, one entry point each per row tile MT; every one
// but f32 with the LoRA delta below, taken when the launch has adapter slots):
//  gemv_bf16_mMT        x bf16 -> y bf16                           (plain)
//  gemv_resid_mMT       x bf16 -> residual f32 += bf16(x·Wᵀ)       (O, down);
//                       with out_norm_w, residual += bf16(RMSNorm(bf16(x·Wᵀ)))
//                       over whole output rows (Gemma's post-attention and
//                       post-MLP norms): each warp leaves its outputs in
//                       out_rows and counts itself in out_ready; the warp
//                       completing the count norms every row and adds it
//  gemv_norm_mMT        RMSNorm(residual f32) -> y bf16            (QKV)
//  gemv_norm_gated_mMT  RMSNorm(residual) -> act(g)·u, bf16, with W = [gate | up],
//                       the warp computing gate row n with up row I + n; act
//                       SiLU or GELU-tanh (act, activation.cuh)
//  gemv_f32_mMT         x bf16 -> y f32                            (LM head logits)
//  gemv_norm_rope_mMT   RMSNorm(residual) -> qkv bf16, then RoPE (rotate-half,
//                       the warp owning rows j and j + D/2 of a head) on q in
//                       qkv and on k into k_cache[slot], v into v_cache[slot]:
//                       what rope_kv_write does, without its launch (with
//                       kv_fp8: k and v stored as e4m3 bytes at k_scale / v_scale;
//                       with kv_rotate: q and k heads Hadamard-rotated after
//                       RoPE by the warp completing each head, below; with
//                       q_norm_w / k_norm_w: each q and k head RMS-normed
//                       before RoPE by that warp, Qwen3's QK-norm; with
//                       bias: each output plus its bias, rounded, before
//                       all of that, Qwen2's QKV bias)
// LoRA (lora_slots != 0; gemv_lora.cuh): each output of a row with an
// adapter slot gets scale[slot] * h[row, seg(c) rank ..] . B[c, slot, seg(c) rank ..]
// (c the weight row, seg its segment of a stacked projection), added as
// lora_expand (cu/lora.cu) adds it after the unfused product: to the
// bf16-rounded projection, before the epilogue's next rounding (SiLU·up,
// RoPE, the bf16 output), or to the f32 residual. h = A[slot] · input (the
// launch's input: bf16 rows, or the residual through the RMSNorm) is the
// shrink, computed by the launch itself so that it costs no launch of its
// own: the first lora_shrink_blocks blocks (m x ceil(hw / GEMV_WARPS), one
// warp per column of h, the A row requested before the PDL wait) write h,
// then count themselves in lora_ready (zero at launch); the GEMV blocks,
// behind them in the grid and so scheduled no earlier, wait for the count
// only in the epilogue, after their product. A warp norming the residual
// sums its squares in the same pass as its dot.
// Norm variants stage bf16(x * rsqrt(mean(x²) + eps) * (norm_offset + norm_w)), exactly what
// add_rmsnorm writes, in dynamic shared memory (m * K * 2 bytes) once per
// block; the others read x through L1. Epilogues round like the unfused path:
// projections to bf16 before the residual add, gate and up to bf16 before act·up,
// a bias added to the rounded projection and rounded again (bias_rows).
#include <cuda_fp8.h>

#include "activation.cuh"
#include "common.cuh"
#include "gemv_formats.cuh"
#include "hadamard.cuh"
#include "kv.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"
#include "sched.cuh"

// Warps per block, rows per warp, the most rows and the register chunks per
// pass (lamina_gemv_chunks<MT, NORM>) come from src/consts.rs.
// 16-byte chunks of norm weights per thread loaded before the PDL wait (K <= 2048 all).
#define GEMV_NORM_REGS 2

enum GemvIn { IN_BF16 = 0, IN_NORM = 1 };
enum GemvOut { OUT_BF16 = 0, OUT_RESID = 1, OUT_F32 = 2, OUT_GATED = 3, OUT_ROPE = 4 };

// The two weight rows of warp `gw` and whether each exists. GATED: gate row gw
// and up row n + gw. ROPE: warps below (n_heads + n_kv) * D/2 own a rotate-half
// pair (h*D + j, h*D + j + D/2) of a q or k head; the rest own two adjacent v rows.
template <int OUT>
__device__ __forceinline__ void gemv_rows_of(const GemvArgs& a, uint32_t gw, uint32_t& r0, uint32_t& r1, bool& ok0,
                                             bool& ok1) {
    if (OUT == OUT_GATED) {
        r0 = gw;
        r1 = a.n + gw;
        ok0 = ok1 = gw < a.n;
    } else if (OUT == OUT_ROPE) {
        const uint32_t half = a.head_dim / 2, pairs = (a.n_heads + a.n_kv) * half;
        if (gw < pairs) {
            r0 = (gw / half) * a.head_dim + gw % half;
            r1 = r0 + half;
        } else {
            r0 = (a.n_heads + a.n_kv) * a.head_dim + (gw - pairs) * 2;
            r1 = r0 + 1;
        }
        ok0 = r0 < a.n;
        ok1 = r1 < a.n;
    } else {
        r0 = gw * LAMINA_GEMV_ROWS_PER_WARP;
        r1 = r0 + 1;
        ok0 = r0 < a.n;
        ok1 = r1 < a.n;
    }
}



__device__ __forceinline__ float round_bf(float v) { return bf2f(f2bf(v)); }

// One pass of a warp: NW chunks of each of its two rows per lane, columns
// base + u * 32 * COLS (u < NW) below kend, with their side records' fields
// (block formats; s0 / s1 the rows' records); zeros past kend or for absent rows.
template <int NW, class F>
__device__ __forceinline__ void gemv_load(const unsigned char* w0, const unsigned char* w1, const unsigned char* s0,
                                          const unsigned char* s1, bool ok0, bool ok1, uint32_t base, uint32_t kend,
                                          uint4* wa, uint4* wb, typename F::Side* sa, typename F::Side* sb) {
    typedef F C;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < NW; u++) {
        const uint32_t kk = base + u * 32 * C::COLS;
        const size_t chunk = (size_t)(kk / C::COLS) * 16, rec = (size_t)(kk / C::GROUP) * C::SIDE;
        const bool in0 = ok0 && kk < kend, in1 = ok1 && kk < kend;
        wa[u] = in0 ? ld_before_wait(w0 + chunk) : z;
        wb[u] = in1 ? ld_before_wait(w1 + chunk) : z;
        sa[u] = in0 ? C::side(s0 + rec, kk) : typename C::Side{};
        sb[u] = in1 ? C::side(s1 + rec, kk) : typename C::Side{};
    }
}

#include "gemv_lora.cuh"

// The ROPE epilogue of whole heads, with kv_rotate or QK-norm (q_norm_w),
// for the warp of a q or k pair (r0, r1 = r0 + D/2 of head h; every lane,
// lane r < m holding token row r's projections d0, d1). A head's D/2 pairs
// live in warps of different blocks, so each leaves its pair un-roped in
// qkv (y) and counts itself in rot_ready[h]; the warp that completes the
// count (the others' pairs released by their fences before it) finishes
// the head of every row from qkv in registers (hadamard.cuh): QK-norm
// (bf16(x * rsqrt(mean(x²) + eps) * (qk_offset + gain)), as head_rmsnorm
// writes it; k's normed values back into qkv), RoPE, the rotation when the
// caches rotate; then q back into qkv, k into the cache at the row's slot
// (qkv keeps the un-roped k), and zeroes the counter for the next launch.
__device__ __forceinline__ void gemv_rope_rotated(const GemvArgs& a, uint32_t r0, uint32_t r1, float d0, float d1) {
    const uint32_t lane = threadIdx.x & 31, D = a.head_dim, h = r0 / D, n = a.n;
    bf16* y = static_cast<bf16*>(a.y);  // [m, n]
    if (lane < a.m) {
        y[(size_t)lane * n + r0] = f2bf(d0);
        y[(size_t)lane * n + r1] = f2bf(d1);
    }
    __threadfence();
    __syncwarp();
    uint32_t before = 0;
    if (lane == 0) before = atomicAdd(a.rot_ready + h, 1u);
    if (__shfl_sync(0xffffffffu, before, 0) != D / 2 - 1) return;
    __threadfence();
    if (lane == 0) a.rot_ready[h] = 0;
    const uint32_t half = D / 2;
    for (uint32_t r = 0; r < a.m; r++) {
        const uint32_t pos = a.positions[r];
        if (pos >= a.max_pos) continue;  // un-roped, no cache write (rope_kv_write)
        bf16* head = y + (size_t)r * n + (size_t)h * D;  // [D]
        float v[HADAMARD_SLOTS];
        hadamard_load(head, D, v);
        if (a.q_norm_w != nullptr) {
            float ss = 0.f;
#pragma unroll
            for (int e = 0; e < HADAMARD_SLOTS; e++) ss += v[e] * v[e];
            const float inv = rsqrtf(warp_sum(ss) / (float)D + a.eps);
            const bf16* g = h < a.n_heads ? a.q_norm_w : a.k_norm_w;
#pragma unroll
            for (int e = 0; e < HADAMARD_SLOTS; e++) {
                const uint32_t i = lane + 32u * e;
                if (i < D) v[e] = round_bf(v[e] * inv * (a.qk_offset + bf2f(g[i])));
            }
            if (h >= a.n_heads) hadamard_store(v, D, head, nullptr, 0, false, 1.f);
        }
        hadamard_rope(v, D, a.cos_t + (size_t)pos * half, a.sin_t + (size_t)pos * half);
        if (a.kv_rotate) hadamard_rotate(v, D);
        if (h < a.n_heads)
            hadamard_store(v, D, head, nullptr, 0, false, 1.f);
        else
            hadamard_store(v, D, nullptr, a.k_cache, ((size_t)a.slots[r] * a.n_kv + (h - a.n_heads)) * D, a.kv_fp8,
                           a.k_scale);
    }
}

// Columns a lane of the output-norm epilogue loads at once.
#define GEMV_OUT_NORM_BATCH 8

// The RESID epilogue with an output norm (out_norm_w), for the warp of rows
// r0 and r0 + 1 (every lane; lane r < m holding token row r's outputs v0,
// v1, rounded as the unfused projection leaves them): each warp leaves its
// outputs in out_rows and counts itself in out_ready; the warp completing
// the count (the others' outputs released by their fences before it) norms
// every whole row as head_rmsnorm does (bf16(v * rsqrt(mean(v²) + eps) *
// (norm_offset + gain))), adds it to the f32 residual as add_rmsnorm adds a
// delta, and zeroes the counter for the next launch.
template <class S>
__device__ __forceinline__ void gemv_out_norm(const GemvArgs& a, uint32_t r0, bool ok1, float v0, float v1) {
    const uint32_t lane = threadIdx.x & 31, n = a.n;
    bf16* rows = a.out_rows;  // [m, n]
    if (lane < a.m) {
        rows[(size_t)lane * n + r0] = f2bf(v0);
        if (ok1) rows[(size_t)lane * n + r0 + 1] = f2bf(v1);
    }
    __threadfence();
    __syncwarp();
    uint32_t before = 0;
    if (lane == 0) before = atomicAdd(a.out_ready, 1u);
    const uint32_t warps = (n + LAMINA_GEMV_ROWS_PER_WARP - 1) / LAMINA_GEMV_ROWS_PER_WARP;
    if (__shfl_sync(0xffffffffu, before, 0) != warps - 1) return;
    __threadfence();
    if (lane == 0) *a.out_ready = 0;
    // Lane l owns columns l, l + 32, ... (head_rmsnorm's order), taken
    // GEMV_OUT_NORM_BATCH at a time: each batch's loads are all issued
    // before its stores, so a row of n costs about 2n / (32 * batch) round
    // trips, not one a column.
    constexpr int B = GEMV_OUT_NORM_BATCH;
    float* y = static_cast<float*>(a.y);  // [m, n]
    for (uint32_t r = 0; r < a.m; r++) {
        const bf16* row = rows + (size_t)r * n;
        float* yr = y + (size_t)r * n;
        float ss = 0.f;
        for (uint32_t i0 = lane; i0 < n; i0 += 32 * B) {
            float v[B];
#pragma unroll
            for (int j = 0; j < B; j++) v[j] = i0 + 32 * j < n ? bf2f(__ldcg(row + i0 + 32 * j)) : 0.f;
#pragma unroll
            for (int j = 0; j < B; j++) ss += v[j] * v[j];
        }
        const float inv = rsqrtf(warp_sum(ss) / (float)n + a.eps);
        for (uint32_t i0 = lane; i0 < n; i0 += 32 * B) {
            float v[B], g[B], o[B];
#pragma unroll
            for (int j = 0; j < B; j++) {
                const uint32_t i = min(i0 + 32 * j, n - 1);  // in range; stored only below n
                v[j] = bf2f(__ldcg(row + i));
                g[j] = a.norm_offset + bf2f(a.out_norm_w[i]);
                o[j] = sched_ldf<S>(yr + i);
            }
#pragma unroll
            for (int j = 0; j < B; j++)
                if (i0 + 32 * j < n) yr[i0 + 32 * j] = o[j] + round_bf(v[j] * inv * g[j]);
        }
    }
}

// Eight inputs of token row r from column col: the block's normalised rows
// in shared memory (IN_NORM) or the launch's bf16 input.
template <int IN, class S>
__device__ __forceinline__ void gemv_x8(const GemvArgs& a, const bf16* xs, uint32_t r, uint32_t K, uint32_t col,
                                        float* xv) {
    if (IN == IN_NORM)
        bf8(*reinterpret_cast<const uint4*>(xs + (size_t)r * K + col), xv);
    else
        bf8(sched_ld16<S>(static_cast<const bf16*>(a.x) + (size_t)r * K + col), xv);
}

// One chunk of an AFFINE format (gemv_formats.cuh) for the warp's two rows:
// its codes' dots with each token row's inputs and the inputs' sum, then
// scale * dot + offset * sum once a chunk, instead of widening every
// weight (about half the operations a weight; the same dot but for f32
// rounding).
template <int MT, int IN, class F, class S>
__device__ __forceinline__ void gemv_affine_chunk(const GemvArgs& a, const bf16* xs, uint32_t m, uint32_t K,
                                                  uint32_t kk, const uint4& wa, const uint4& wb,
                                                  const typename F::Side& sa, const typename F::Side& sb,
                                                  float* acc0, float* acc1) {
    float qa[F::COLS], qb[F::COLS], ca, oa, cb, ob;
    F::codes(wa, sa, kk, qa, ca, oa);
    F::codes(wb, sb, kk, qb, cb, ob);
#pragma unroll
    for (int r = 0; r < MT; r++) {
        if (r < (int)m) {
            float da = 0.f, db = 0.f, sx = 0.f;
#pragma unroll
            for (uint32_t h = 0; h < F::COLS; h += 8) {
                float xv[8];
                gemv_x8<IN, S>(a, xs, r, K, kk + h, xv);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    da = fmaf(qa[h + i], xv[i], da);
                    db = fmaf(qb[h + i], xv[i], db);
                    sx += xv[i];
                }
            }
            acc0[r] = fmaf(oa, sx, fmaf(ca, da, acc0[r]));
            acc1[r] = fmaf(ob, sx, fmaf(cb, db, acc1[r]));
        }
    }
}

// `block` the block index among the launch's GEMV blocks; `sched` how the
// body waits for earlier work and reads its outputs (sched.cuh).
template <int MT, int IN, int OUT, class F, class S>
__device__ __forceinline__ void gemv_impl(const GemvArgs& a, uint32_t block, const S& sched) {
    typedef F C;
    // NC 16-byte chunks of 8 columns a pass: 256 * NC columns, which wider
    // formats (16 or 32 columns a chunk) load in NW = NC * 8 / COLS chunks.
    constexpr int NC = lamina_gemv_chunks<MT, IN == IN_NORM>::value;
    constexpr int NW = NC * 8 / C::COLS;
    static_assert(NW > 0 && NW * C::COLS == NC * 8, "GEMV chunk counts must cover whole chunks of every format");
    // IN_NORM: the block's normalised inputs, bf16 [m, K] (dynamic, m * K * 2 bytes).
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    __shared__ float part[LAMINA_GEMV_WARPS][MT];     // inverse-RMS partial sums
    __shared__ float red[LAMINA_GEMV_WARPS][2][MT];   // split-K partial dots
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t K = a.k, m = a.m, nsplit = a.ksplit;
    const uint32_t ks = warp % nsplit, gw = block * (LAMINA_GEMV_WARPS / nsplit) + warp / nsplit;
    uint32_t r0, r1;
    bool ok0, ok1;
    gemv_rows_of<OUT>(a, gw, r0, r1, ok0, ok1);
    const uint32_t span = (K / C::COLS + nsplit - 1) / nsplit * C::COLS;
    const uint32_t kbeg = min(K, ks * span), kend = min(K, kbeg + span);
    const unsigned char* wbase = static_cast<const unsigned char*>(a.w);
    const unsigned char* sbase = static_cast<const unsigned char*>(a.w_side);
    const size_t row_bytes = (size_t)(K / C::COLS) * 16, side_bytes = (size_t)(K / C::GROUP) * C::SIDE;
    const unsigned char* w0 = wbase + (size_t)(ok0 ? r0 : 0) * row_bytes;
    const unsigned char* w1 = wbase + (size_t)(ok1 ? r1 : 0) * row_bytes;
    const unsigned char* sd0 = sbase + (size_t)(ok0 ? r0 : 0) * side_bytes;
    const unsigned char* sd1 = sbase + (size_t)(ok1 ? r1 : 0) * side_bytes;
    // Weights do not depend on earlier kernels: the first pass's loads are
    // in flight before the PDL wait (and before the norm prologue); so are
    // the rows' FP8 scales and the chunks' block records.
    uint4 wa[NW], wb[NW];
    typename C::Side sa[NW], sb[NW];
    gemv_load<NW, F>(w0, w1, sd0, sd1, ok0, ok1, kbeg + lane * C::COLS, kend, wa, wb, sa, sb);
    const float* row_scale = static_cast<const float*>(a.w_side);
    const float s0 = F::SCALED && ok0 ? row_scale[r0] : 1.f, s1 = F::SCALED && ok1 ? row_scale[r1] : 1.f;
    // So are the norm weights: thread t normalises columns t * 8 + j * 1024.
    constexpr int NJ = GEMV_NORM_REGS;
    uint4 nwv[NJ];
    if (IN == IN_NORM) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t i = threadIdx.x * 8 + j * LAMINA_GEMV_WARPS * 256;
            nwv[j] = i < K ? ld_before_wait(a.norm_w + i) : make_uint4(0, 0, 0, 0);
        }
    }
    // ROPE's bias of the warp's rows (a weight too)
    float b0 = 0.f, b1 = 0.f;
    if (OUT == OUT_ROPE && a.bias != nullptr) {
        if (ok0) b0 = bf2f(a.bias[r0]);
        if (ok1) b1 = bf2f(a.bias[r1]);
    }
    sched.wait();
    // Everything the epilogue reads from earlier kernels is requested now, in
    // the shadow of the input loads: the residual (RESID) and the position,
    // slot and rotation of token row `lane` (ROPE).
    const uint32_t er = lane < m ? lane : 0;
    float res0 = 0.f, res1 = 0.f, rc = 1.f, rs = 0.f;
    uint32_t rpos = 0;
    size_t rslot = 0;
    if (OUT == OUT_RESID && ok0 && ks == 0 && lane < m) {
        const float* y = static_cast<const float*>(a.y) + (size_t)er * a.n;
        res0 = sched_ldf<S>(y + r0);
        if (ok1) res1 = sched_ldf<S>(y + r1);
    }
    if (OUT == OUT_ROPE && ok0 && ks == 0 && lane < m) {
        rpos = a.positions[er];
        rslot = a.slots[er];
    }
    uint32_t lslot = 0;
    if (OUT != OUT_F32 && a.lora_slots != 0 && ok0 && ks == 0 && lane < m) {
        lslot = a.lora_slot_of[er];
        if (lslot > a.lora_slots) lslot = 0;
    }
    bf16* xs = reinterpret_cast<bf16*>(gemv_smem);
    if (IN == IN_NORM) {
        // inv_rms of each row (all threads), then xs = bf16(x * inv_rms * norm_w).
        const float* x = static_cast<const float*>(a.x);
        float ss[MT];
#pragma unroll
        for (int r = 0; r < MT; r++) {
            ss[r] = 0.f;
            if (r < (int)m) {
                // Four float4 per thread in flight at once (one L2 round trip per 2,048 columns).
                for (uint32_t i0 = threadIdx.x * 4; i0 < K; i0 += 4 * LAMINA_GEMV_WARPS * 128) {
                    float4 v[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint32_t i = i0 + j * LAMINA_GEMV_WARPS * 128;
                        v[j] = i < K ? sched_ldf4<S>(x + (size_t)r * K + i) : make_float4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int j = 0; j < 4; j++) ss[r] += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
                }
            }
            ss[r] = warp_sum(ss[r]);
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < MT; r++) part[warp][r] = ss[r];
        }
        __syncthreads();
        for (uint32_t r = 0; r < m; r++) {
            float t = 0.f;
#pragma unroll
            for (int w = 0; w < LAMINA_GEMV_WARPS; w++) t += part[w][r];
            const float inv = rsqrtf(t / (float)K + a.eps);
            uint32_t j = 0;
            for (uint32_t i = threadIdx.x * 8; i < K; i += LAMINA_GEMV_WARPS * 256, j++) {
                const float* xr = x + (size_t)r * K + i;
                const float4 p = sched_ldf4<S>(xr);
                const float4 q = sched_ldf4<S>(xr + 4);
                const float raw[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
                uint4 nraw = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int jj = 0; jj < NJ; jj++)
                    if (j == (uint32_t)jj) nraw = nwv[jj];
                if (j >= (uint32_t)NJ) nraw = __ldg(reinterpret_cast<const uint4*>(a.norm_w + i));
                float nw[8];
                bf8(nraw, nw);
                uint4 o;
                __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
                    oh[jj] = __floats2bfloat162_rn(raw[2 * jj] * inv * (a.norm_offset + nw[2 * jj]),
                                                   raw[2 * jj + 1] * inv * (a.norm_offset + nw[2 * jj + 1]));
                *reinterpret_cast<uint4*>(xs + (size_t)r * K + i) = o;
            }
        }
        __syncthreads();
    }
    // The rotation of row r0 at the token's position (its position has arrived by now).
    if (OUT == OUT_ROPE && ok0 && ks == 0 && lane < m) {
        const uint32_t D = a.head_dim, half = D / 2;
        if (r0 / D < a.n_heads + a.n_kv && rpos < a.max_pos) {
            rc = a.cos_t[(size_t)rpos * half + r0 % D];
            rs = a.sin_t[(size_t)rpos * half + r0 % D];
        }
    }
    float acc0[MT], acc1[MT];
#pragma unroll
    for (int r = 0; r < MT; r++) acc0[r] = acc1[r] = 0.f;
    if (ok0) {
        for (uint32_t pass = kbeg; pass < kend; pass += 32 * NW * C::COLS) {
            if (pass != kbeg)
                gemv_load<NW, F>(w0, w1, sd0, sd1, ok0, ok1, pass + lane * C::COLS, kend, wa, wb, sa, sb);
#pragma unroll
            for (int u = 0; u < NW; u++) {
                const uint32_t kk = pass + lane * C::COLS + u * 32 * C::COLS;
                if (kk >= kend) break;
                if constexpr (C::AFFINE) {
                    gemv_affine_chunk<MT, IN, F, S>(a, xs, m, K, kk, wa[u], wb[u], sa[u], sb[u], acc0, acc1);
                    continue;
                }
                float fa[C::COLS], fb[C::COLS];
                C::widen(wa[u], sa[u], kk, fa);
                C::widen(wb[u], sb[u], kk, fb);
#pragma unroll
                for (int r = 0; r < MT; r++) {
                    if (r < (int)m) {
#pragma unroll
                        for (uint32_t h = 0; h < C::COLS; h += 8) {
                            float xv[8];
                            gemv_x8<IN, S>(a, xs, r, K, kk + h, xv);
#pragma unroll
                            for (int i = 0; i < 8; i++) {
                                acc0[r] = fmaf(fa[h + i], xv[i], acc0[r]);
                                acc1[r] = fmaf(fb[h + i], xv[i], acc1[r]);
                            }
                        }
                    }
                }
            }
        }
    }
    // Lane r ends with token row r's two dots (warp sums, then the split-K
    // partials of the pair's warps added in split order).
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int r = 0; r < MT; r++) {
        const float s0 = warp_sum(acc0[r]), s1 = warp_sum(acc1[r]);
        if (lane == (uint32_t)r) {
            d0 = s0;
            d1 = s1;
        }
    }
    if (nsplit > 1) {
        if (lane < m) {
            red[warp][0][lane] = d0;
            red[warp][1][lane] = d1;
        }
        __syncthreads();
        if (ks != 0) return;
        if (lane < m) {
            d0 = d1 = 0.f;
            for (uint32_t j = 0; j < nsplit; j++) {
                d0 += red[warp + j][0][lane];
                d1 += red[warp + j][1][lane];
            }
        }
    }
    // Lanes >= m stay until the rotating ROPE epilogue (whole warps): their
    // dots are zero and their lslot 0.
    if (!ok0) return;
    if (F::SCALED) {
        d0 *= s0;
        d1 *= s1;
    }
    const uint32_t r = lane, outs = a.n, o0 = r0;
    float l0 = 0.f, l1 = 0.f;  // LoRA deltas (module doc)
    if (OUT != OUT_F32 && lslot != 0) {
        const float2 l = gemv_lora_deltas(lora_view(a), r, lslot, r0, r1, ok1);
        l0 = l.x;
        l1 = l.y;
        if (OUT != OUT_RESID) {
            d0 = round_bf(d0) + l0;
            d1 = round_bf(d1) + l1;
        }
    }
    if (OUT == OUT_ROPE && a.bias != nullptr) {
        d0 = round_bf(d0) + b0;
        d1 = round_bf(d1) + b1;
    }
    if (OUT == OUT_ROPE && (a.kv_rotate || a.q_norm_w != nullptr) && r0 / a.head_dim < a.n_heads + a.n_kv) {
        gemv_rope_rotated(a, r0, r1, round_bf(d0), round_bf(d1));
        return;
    }
    if (OUT == OUT_RESID && a.out_norm_w != nullptr) {
        gemv_out_norm<S>(a, r0, ok1, round_bf(d0) + l0, round_bf(d1) + l1);
        return;
    }
    if (lane >= m) return;
    if (OUT == OUT_GATED) {
        const float g = round_bf(d0), u = round_bf(d1);
        static_cast<bf16*>(a.y)[(size_t)r * outs + o0] = f2bf(gate_act_f(a.act, g) * u);
    } else if (OUT == OUT_ROPE) {
        // qkv keeps the GEMM output (q roped, as rope_kv_write leaves it);
        // k (roped) and v go to the cache slot of token r.
        bf16* y = static_cast<bf16*>(a.y) + (size_t)r * outs;
        const float x1 = round_bf(d0), x2 = round_bf(d1);
        const uint32_t D = a.head_dim, half = D / 2, h = r0 / D, kvw = a.n_kv * D;
        if (h >= a.n_heads + a.n_kv) {  // two v values
            y[r0] = f2bf(x1);
            if (ok1) y[r1] = f2bf(x2);
            if (rpos < a.max_pos) {
                const uint32_t vi = r0 - (a.n_heads + a.n_kv) * D;
                kv_store(a.v_cache, rslot * kvw + vi, x1, a.kv_fp8, a.v_scale);
                if (ok1) kv_store(a.v_cache, rslot * kvw + vi + 1, x2, a.kv_fp8, a.v_scale);
            }
        } else if (rpos < a.max_pos) {
            const uint32_t j = r0 % D;
            const float o1 = x1 * rc - x2 * rs, o2 = x2 * rc + x1 * rs;
            if (h < a.n_heads) {
                y[r0] = f2bf(o1);
                y[r1] = f2bf(o2);
            } else {
                y[r0] = f2bf(x1);
                y[r1] = f2bf(x2);
                const size_t kc = rslot * kvw + (size_t)(h - a.n_heads) * D;
                kv_store(a.k_cache, kc + j, o1, a.kv_fp8, a.k_scale);
                kv_store(a.k_cache, kc + j + half, o2, a.kv_fp8, a.k_scale);
            }
        } else {
            y[r0] = f2bf(x1);
            y[r1] = f2bf(x2);
        }
    } else if (OUT == OUT_BF16) {
        bf16* y = static_cast<bf16*>(a.y) + (size_t)r * outs;
        y[o0] = f2bf(d0);
        if (ok1) y[o0 + 1] = f2bf(d1);
    } else if (OUT == OUT_RESID) {
        float* y = static_cast<float*>(a.y) + (size_t)r * outs;
        y[o0] = res0 + round_bf(d0) + l0;
        if (ok1) y[o0 + 1] = res1 + round_bf(d1) + l1;
    } else {
        float* y = static_cast<float*>(a.y) + (size_t)r * outs;
        y[o0] = d0;
        if (ok1) y[o0 + 1] = d1;
    }
}

// An entry point: the LoRA shrink blocks first (none without adapter
// slots: the module doc's LoRA paragraph), then the GEMV's.
#define GEMV_ENTRY(NAME, MT, IN, OUT, F)                                                               \
    extern "C" __global__ void __launch_bounds__(LAMINA_GEMV_WARPS * 32) NAME##_m##MT(const GemvArgs a) { \
        if (blockIdx.x < a.lora_shrink_blocks)                                                         \
            gemv_lora_shrink<IN>(lora_view(a), blockIdx.x);                                            \
        else                                                                                           \
            gemv_impl<MT, IN, OUT, F>(a, blockIdx.x - a.lora_shrink_blocks, LaunchSched{});            \
    }
// The LM head's entry point, which has no LoRA delta.
#define GEMV_HEAD_ENTRY(NAME, MT, IN, OUT, F)                                                          \
    extern "C" __global__ void __launch_bounds__(LAMINA_GEMV_WARPS * 32) NAME##_m##MT(const GemvArgs a) { \
        gemv_impl<MT, IN, OUT, F>(a, blockIdx.x, LaunchSched{});                                       \
    }
#define GEMV_TILES_OF(ENTRY, NAME, IN, OUT, F) \
    ENTRY(NAME, 1, IN, OUT, F)                 \
    ENTRY(NAME, 2, IN, OUT, F)                 \
    ENTRY(NAME, 4, IN, OUT, F)                 \
    ENTRY(NAME, 8, IN, OUT, F)                 \
    ENTRY(NAME, 16, IN, OUT, F)
#define GEMV_TILES(NAME, IN, OUT, F) GEMV_TILES_OF(GEMV_ENTRY, NAME, IN, OUT, F)
// Every variant for one weight format, named PREFIX_variant (the prefix is
// `gemv::WeightFormat::prefix` in the launcher).
#define GEMV_FORMAT(PREFIX, F)                                \
    GEMV_TILES(PREFIX##_bf16, IN_BF16, OUT_BF16, F)           \
    GEMV_TILES(PREFIX##_resid, IN_BF16, OUT_RESID, F)         \
    GEMV_TILES(PREFIX##_norm, IN_NORM, OUT_BF16, F)           \
    GEMV_TILES(PREFIX##_norm_gated, IN_NORM, OUT_GATED, F)      \
    GEMV_TILES_OF(GEMV_HEAD_ENTRY, PREFIX##_f32, IN_BF16, OUT_F32, F) \
    GEMV_TILES(PREFIX##_norm_rope, IN_NORM, OUT_ROPE, F)
GEMV_FORMAT(gemv, FmtBf16)
GEMV_FORMAT(gemv8, FmtFp8Row)
GEMV_FORMAT(gemv_q8_0, FmtQ8_0)
GEMV_FORMAT(gemv_q4_0, FmtQ4_0)
GEMV_FORMAT(gemv_q4_1, FmtQ4_1)
GEMV_FORMAT(gemv_q4_k, FmtQ4K)
GEMV_FORMAT(gemv_q5_k, FmtQ5K)
GEMV_FORMAT(gemv_q6_k, FmtQ6K)
GEMV_FORMAT(gemv_int4, FmtInt4)
