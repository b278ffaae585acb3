// GEMV-shaped projections for small steps (m <= GEMV_MAX_ROWS token rows):
// y[m, n] = x[m, K] · W[n, K]ᵀ with bf16 weights (nn.Linear, row-major),
// fp32 accumulation, every weight row read once for all m rows.
//
// Grid ceil(outputs / (GEMV_WARPS * GEMV_ROWS_PER_WARP)) blocks of
// GEMV_WARPS warps; each warp owns GEMV_ROWS_PER_WARP weight rows and streams
// them with 16-byte loads (8 bf16 per lane, GEMV_UNROLL chunks in flight per
// row), reading the matching 8 inputs of each of the m rows (L1/L2 resident),
// then reduces over the warp. Requires K % 8 == 0 (16-byte aligned rows).
//
// Variants (template flags, one entry point each per row tile MT):
//  gemv_bf16_mMT        x bf16 -> y bf16                           (plain)
//  gemv_resid_mMT       x bf16 -> residual f32 += bf16(x·Wᵀ)       (O, down)
//  gemv_norm_mMT        RMSNorm(residual f32) -> y bf16            (QKV)
//  gemv_norm_silu_mMT   RMSNorm(residual) -> silu(g)·u, bf16, with W = [gate | up]
//                       and the warp computing gate row n with up row I + n
//  gemv_f32_mMT         x bf16 -> y f32                            (LM head logits)
//  gemv_norm_rope_mMT   RMSNorm(residual) -> qkv bf16, then RoPE (rotate-half,
//                       the warp owning rows j and j + D/2 of a head) on q in
//                       qkv and on k into k_cache[slot], v into v_cache[slot]:
//                       what rope_kv_write does, without its launch
// The normed input is bf16(x * rsqrt(mean(x²) + eps) * norm_w), exactly what
// add_rmsnorm writes; each block recomputes the inverse RMS of its m rows.
// Epilogues round like the unfused path: projections to bf16 before the
// residual add, gate and up to bf16 before silu·up.
#include "common.cuh"
#include "pdl.cuh"

// Shared with gemv.rs (WARPS, ROWS_PER_WARP, MAX_ROWS): keep equal.
#define GEMV_WARPS 4
#define GEMV_ROWS_PER_WARP 2
#define GEMV_MAX_ROWS 16
#define GEMV_UNROLL 4
// 128-byte lines of each weight row prefetched to L2 before the PDL wait (<= 16).
#define GEMV_PREFETCH_LINES 16

struct GemvArgs {
    const void* x;        // [m, K] bf16, or the f32 residual for the norm variants
    const bf16* norm_w;   // [K] (norm variants) else unused
    const bf16* w;        // [N, K]; N = 2 * n for norm_silu
    void* y;              // [m, n] bf16 / f32 (resid: the f32 residual, read and written)
    uint32_t m;           // token rows, 1..=MT
    uint32_t n;           // outputs per row
    uint32_t k;           // inputs per row, multiple of 8
    float eps;
    // norm_rope only (else zero): RoPE + KV write in the epilogue, as rope_kv_write.
    const uint32_t* positions;  // [m]
    const uint32_t* slots;      // [m]
    const float* cos_t;         // [max_pos, D/2]
    const float* sin_t;         // [max_pos, D/2]
    bf16* k_cache;              // [slots, n_kv, D]
    bf16* v_cache;              // [slots, n_kv, D]
    uint32_t n_heads;
    uint32_t n_kv;
    uint32_t head_dim;
    uint32_t max_pos;
};
static_assert(sizeof(GemvArgs) == 112, "GemvArgs layout");
static_assert(offsetof(GemvArgs, x) == 0, "GemvArgs.x");
static_assert(offsetof(GemvArgs, norm_w) == 8, "GemvArgs.norm_w");
static_assert(offsetof(GemvArgs, w) == 16, "GemvArgs.w");
static_assert(offsetof(GemvArgs, y) == 24, "GemvArgs.y");
static_assert(offsetof(GemvArgs, m) == 32, "GemvArgs.m");
static_assert(offsetof(GemvArgs, n) == 36, "GemvArgs.n");
static_assert(offsetof(GemvArgs, k) == 40, "GemvArgs.k");
static_assert(offsetof(GemvArgs, eps) == 44, "GemvArgs.eps");
static_assert(offsetof(GemvArgs, positions) == 48, "GemvArgs.positions");
static_assert(offsetof(GemvArgs, slots) == 56, "GemvArgs.slots");
static_assert(offsetof(GemvArgs, cos_t) == 64, "GemvArgs.cos_t");
static_assert(offsetof(GemvArgs, sin_t) == 72, "GemvArgs.sin_t");
static_assert(offsetof(GemvArgs, k_cache) == 80, "GemvArgs.k_cache");
static_assert(offsetof(GemvArgs, v_cache) == 88, "GemvArgs.v_cache");
static_assert(offsetof(GemvArgs, n_heads) == 96, "GemvArgs.n_heads");
static_assert(offsetof(GemvArgs, n_kv) == 100, "GemvArgs.n_kv");
static_assert(offsetof(GemvArgs, head_dim) == 104, "GemvArgs.head_dim");
static_assert(offsetof(GemvArgs, max_pos) == 108, "GemvArgs.max_pos");

enum GemvIn { IN_BF16 = 0, IN_NORM = 1 };
enum GemvOut { OUT_BF16 = 0, OUT_RESID = 1, OUT_F32 = 2, OUT_SILU = 3, OUT_ROPE = 4 };

// The two weight rows of warp `gw` and whether each exists. SILU: gate row gw
// and up row n + gw. ROPE: warps below (n_heads + n_kv) * D/2 own a rotate-half
// pair (h*D + j, h*D + j + D/2) of a q or k head; the rest own two adjacent v rows.
template <int OUT>
__device__ __forceinline__ void gemv_rows_of(const GemvArgs& a, uint32_t gw, uint32_t& r0, uint32_t& r1, bool& ok0,
                                             bool& ok1) {
    if (OUT == OUT_SILU) {
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
        r0 = gw * GEMV_ROWS_PER_WARP;
        r1 = r0 + 1;
        ok0 = r0 < a.n;
        ok1 = r1 < a.n;
    }
}


__device__ __forceinline__ void bf8(const uint4 raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ float round_bf(float v) { return bf2f(f2bf(v)); }

template <int MT, int IN, int OUT>
__device__ __forceinline__ void gemv_impl(const GemvArgs& a) {
    __shared__ float inv_rms[MT];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t K = a.k, m = a.m;
    const uint32_t gw = blockIdx.x * GEMV_WARPS + warp;
    uint32_t r0, r1;
    bool ok0, ok1;
    gemv_rows_of<OUT>(a, gw, r0, r1, ok0, ok1);
    {
        // Weights do not depend on the previous kernel: start pulling this
        // warp's first GEMV_PREFETCH_LINES lines of each row into L2 first.
        const uint32_t line = lane % GEMV_PREFETCH_LINES, which = lane / GEMV_PREFETCH_LINES;
        const bool ok = which == 0 ? ok0 : ok1;
        if (which < 2 && ok && line * 64 < K) prefetch_l2(a.w + (size_t)(which == 0 ? r0 : r1) * K + line * 64);
    }
    pdl_wait();
    pdl_launch_dependents();
    if (IN == IN_NORM) {
        const float* x = static_cast<const float*>(a.x);
        for (uint32_t r = warp; r < m; r += GEMV_WARPS) {
            float ss = 0.f;
            for (uint32_t i = lane * 4; i < K; i += 128) {
                const float4 v = *reinterpret_cast<const float4*>(x + (size_t)r * K + i);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = warp_sum(ss);
            if (lane == 0) inv_rms[r] = rsqrtf(ss / (float)K + a.eps);
        }
        __syncthreads();
    }
    const uint32_t outs = a.n, o0 = r0;
    if (!ok0) return;  // no block-wide barrier follows
    const bf16* w0 = a.w + (size_t)r0 * K;
    const bf16* w1 = a.w + (size_t)(ok1 ? r1 : r0) * K;
    float acc0[MT], acc1[MT];
#pragma unroll
    for (int r = 0; r < MT; r++) acc0[r] = acc1[r] = 0.f;

    for (uint32_t base = lane * 8; base < K; base += 256 * GEMV_UNROLL) {
        uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const uint32_t kk = base + u * 256;
            if (kk < K) {
                wa[u] = __ldg(reinterpret_cast<const uint4*>(w0 + kk));
                wb[u] = __ldg(reinterpret_cast<const uint4*>(w1 + kk));
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const uint32_t kk = base + u * 256;
            if (kk >= K) break;
            float fa[8], fb[8], nw[8];
            bf8(wa[u], fa);
            bf8(wb[u], fb);
            if (IN == IN_NORM) bf8(__ldg(reinterpret_cast<const uint4*>(a.norm_w + kk)), nw);
#pragma unroll
            for (int r = 0; r < MT; r++) {
                if (r < (int)m) {
                    float xv[8];
                    if (IN == IN_NORM) {
                        const float* xr = static_cast<const float*>(a.x) + (size_t)r * K + kk;
                        const float4 p = *reinterpret_cast<const float4*>(xr);
                        const float4 q = *reinterpret_cast<const float4*>(xr + 4);
                        const float raw[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
                        const float inv = inv_rms[r];
#pragma unroll
                        for (int i = 0; i < 8; i++) xv[i] = round_bf(raw[i] * inv * nw[i]);
                    } else {
                        bf8(__ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.x) + (size_t)r * K + kk)),
                            xv);
                    }
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        acc0[r] = fmaf(fa[i], xv[i], acc0[r]);
                        acc1[r] = fmaf(fb[i], xv[i], acc1[r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MT; r++) {
        acc0[r] = warp_sum(acc0[r]);
        acc1[r] = warp_sum(acc1[r]);
    }
    // Lane r writes token row r (values are warp-uniform after the sums).
#pragma unroll
    for (int r = 0; r < MT; r++) {
        if (lane != (uint32_t)r || r >= (int)m) continue;
        if (OUT == OUT_SILU) {
            const float g = round_bf(acc0[r]), u = round_bf(acc1[r]);
            static_cast<bf16*>(a.y)[(size_t)r * outs + o0] = f2bf(g / (1.f + __expf(-g)) * u);
        } else if (OUT == OUT_ROPE) {
            // qkv keeps the GEMM output (q roped, as rope_kv_write leaves it);
            // k (roped) and v go to the cache slot of token r.
            bf16* y = static_cast<bf16*>(a.y) + (size_t)r * outs;
            const float x1 = round_bf(acc0[r]), x2 = round_bf(acc1[r]);
            const uint32_t pos = a.positions[r];
            const size_t slot = a.slots[r];
            const uint32_t D = a.head_dim, half = D / 2, h = r0 / D, kvw = a.n_kv * D;
            if (h >= a.n_heads + a.n_kv) {  // two v values
                y[r0] = f2bf(x1);
                if (ok1) y[r1] = f2bf(x2);
                if (pos < a.max_pos) {
                    const uint32_t vi = r0 - (a.n_heads + a.n_kv) * D;
                    a.v_cache[slot * kvw + vi] = f2bf(x1);
                    if (ok1) a.v_cache[slot * kvw + vi + 1] = f2bf(x2);
                }
            } else if (pos < a.max_pos) {
                const uint32_t j = r0 % D;
                const float c = a.cos_t[(size_t)pos * half + j], sn = a.sin_t[(size_t)pos * half + j];
                const float o1 = x1 * c - x2 * sn, o2 = x2 * c + x1 * sn;
                if (h < a.n_heads) {
                    y[r0] = f2bf(o1);
                    y[r1] = f2bf(o2);
                } else {
                    y[r0] = f2bf(x1);
                    y[r1] = f2bf(x2);
                    bf16* kc = a.k_cache + slot * kvw + (size_t)(h - a.n_heads) * D;
                    kc[j] = f2bf(o1);
                    kc[j + half] = f2bf(o2);
                }
            } else {
                y[r0] = f2bf(x1);
                y[r1] = f2bf(x2);
            }
        } else if (OUT == OUT_BF16) {
            bf16* y = static_cast<bf16*>(a.y) + (size_t)r * outs;
            y[o0] = f2bf(acc0[r]);
            if (ok1) y[o0 + 1] = f2bf(acc1[r]);
        } else if (OUT == OUT_RESID) {
            float* y = static_cast<float*>(a.y) + (size_t)r * outs;
            y[o0] += round_bf(acc0[r]);
            if (ok1) y[o0 + 1] += round_bf(acc1[r]);
        } else {
            float* y = static_cast<float*>(a.y) + (size_t)r * outs;
            y[o0] = acc0[r];
            if (ok1) y[o0 + 1] = acc1[r];
        }
    }
}

#define GEMV_ENTRY(NAME, MT, IN, OUT)                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) NAME##_m##MT(const GemvArgs a) { \
        gemv_impl<MT, IN, OUT>(a);                                                                     \
    }
#define GEMV_TILES(NAME, IN, OUT) \
    GEMV_ENTRY(NAME, 1, IN, OUT)  \
    GEMV_ENTRY(NAME, 2, IN, OUT)  \
    GEMV_ENTRY(NAME, 4, IN, OUT)  \
    GEMV_ENTRY(NAME, 8, IN, OUT)  \
    GEMV_ENTRY(NAME, 16, IN, OUT)
GEMV_TILES(gemv_bf16, IN_BF16, OUT_BF16)
GEMV_TILES(gemv_resid, IN_BF16, OUT_RESID)
GEMV_TILES(gemv_norm, IN_NORM, OUT_BF16)
GEMV_TILES(gemv_norm_silu, IN_NORM, OUT_SILU)
GEMV_TILES(gemv_f32, IN_BF16, OUT_F32)
GEMV_TILES(gemv_norm_rope, IN_NORM, OUT_ROPE)
