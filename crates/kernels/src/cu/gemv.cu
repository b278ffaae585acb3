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
};
static_assert(sizeof(GemvArgs) == 48, "GemvArgs layout");
static_assert(offsetof(GemvArgs, x) == 0, "GemvArgs.x");
static_assert(offsetof(GemvArgs, norm_w) == 8, "GemvArgs.norm_w");
static_assert(offsetof(GemvArgs, w) == 16, "GemvArgs.w");
static_assert(offsetof(GemvArgs, y) == 24, "GemvArgs.y");
static_assert(offsetof(GemvArgs, m) == 32, "GemvArgs.m");
static_assert(offsetof(GemvArgs, n) == 36, "GemvArgs.n");
static_assert(offsetof(GemvArgs, k) == 40, "GemvArgs.k");
static_assert(offsetof(GemvArgs, eps) == 44, "GemvArgs.eps");

enum GemvIn { IN_BF16 = 0, IN_NORM = 1 };
enum GemvOut { OUT_BF16 = 0, OUT_RESID = 1, OUT_F32 = 2, OUT_SILU = 3 };

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
    {
        // Weights do not depend on the previous kernel: start pulling this
        // warp's first GEMV_PREFETCH_LINES lines of each row into L2 first.
        const uint32_t wr = (OUT == OUT_SILU ? blockIdx.x * GEMV_WARPS + warp
                                             : (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS_PER_WARP);
        const uint32_t rows = OUT == OUT_SILU ? 2 * a.n : a.n;
        const uint32_t line = lane % GEMV_PREFETCH_LINES, which = lane / GEMV_PREFETCH_LINES;
        const uint32_t r = OUT == OUT_SILU ? (which == 0 ? wr : a.n + wr) : wr + which;
        if (which < 2 && r < rows && line * 64 < K && (OUT != OUT_SILU || wr < a.n))
            prefetch_l2(a.w + (size_t)r * K + line * 64);
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
    // Output index of this warp's rows; SILU: row0 = gate n, row1 = up n (at N/2 + n).
    const uint32_t outs = a.n;
    uint32_t o0, r0, r1;
    bool ok0, ok1;
    if (OUT == OUT_SILU) {
        o0 = blockIdx.x * GEMV_WARPS + warp;
        ok0 = ok1 = o0 < outs;
        r0 = o0;
        r1 = outs + o0;
    } else {
        o0 = (blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS_PER_WARP;
        ok0 = o0 < outs;
        ok1 = o0 + 1 < outs;
        r0 = o0;
        r1 = o0 + 1;
    }
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
