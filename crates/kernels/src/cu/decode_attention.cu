// Decode attention: one query token per sequence, paged, GQA-aware,
// flash-decoding with a device-side chunk so the work follows the real
// context, not the longest context a captured graph may meet.
//
// decode_attention_dD_gC: grid (splits, S, n_kv), DECODE_THREADS threads.
//   `splits` is fixed on the host from S (enough blocks to fill the GPU);
//   each block computes its key range from the device-side context length:
//   chunk = round_up(ceil(ctx / splits), DECODE_CHUNK_GRAN), keys
//   [split*chunk, min(ctx, (split+1)*chunk)); blocks past the context exit.
//   Within a block, each key is read by D/8 lanes (one 16-byte uint4 of K and
//   of V each), so a warp works on 32/(D/8) keys at once; every K/V load
//   serves all G = n_heads/n_kv query heads of the group (G <= C). Each lane
//   group keeps an online softmax (log2 domain: q is pre-scaled by
//   log2(e)/sqrt(D)); states are merged across the warp with shuffles, then
//   across warps in shared memory. With splits == 1 the block writes the
//   normalised bf16 output; otherwise un-normalised partials + (max, sum).
// decode_combine: grid (S, n_heads), max(32, D) threads: merges the
//   ceil(ctx / chunk) partials of each head into out (bf16).
#include "common.cuh"
#include "pdl.cuh"

// Shared with decode_attention.rs (THREADS, CHUNK_GRAN): keep equal.
#define DECODE_THREADS 128
#define DECODE_CHUNK_GRAN 16
// Keys each lane group loads before using them (memory-level parallelism).
#define DECODE_UNROLL 2

struct DecodeArgs {
    const bf16* qkv;               // [S, (n_heads + 2 n_kv) D], q roped
    const bf16* k_cache;           // [slots, n_kv, D]
    const bf16* v_cache;           // [slots, n_kv, D]
    const uint32_t* context_lens;  // [S]
    const uint32_t* block_tables;  // [S, max_blocks]
    float* part_o;                 // [S, n_heads, splits, D] (splits > 1)
    float* part_ml;                // [S, n_heads, splits, 2] (splits > 1)
    bf16* out;                     // [S, n_heads D] (splits == 1)
    uint32_t max_blocks;
    uint32_t n_heads;
    uint32_t n_kv;
    uint32_t block_size;
    uint32_t splits;
    float scale_log2;              // log2(e) / sqrt(D)
};
static_assert(sizeof(DecodeArgs) == 88, "DecodeArgs layout");
static_assert(offsetof(DecodeArgs, qkv) == 0, "DecodeArgs.qkv");
static_assert(offsetof(DecodeArgs, k_cache) == 8, "DecodeArgs.k_cache");
static_assert(offsetof(DecodeArgs, v_cache) == 16, "DecodeArgs.v_cache");
static_assert(offsetof(DecodeArgs, context_lens) == 24, "DecodeArgs.context_lens");
static_assert(offsetof(DecodeArgs, block_tables) == 32, "DecodeArgs.block_tables");
static_assert(offsetof(DecodeArgs, part_o) == 40, "DecodeArgs.part_o");
static_assert(offsetof(DecodeArgs, part_ml) == 48, "DecodeArgs.part_ml");
static_assert(offsetof(DecodeArgs, out) == 56, "DecodeArgs.out");
static_assert(offsetof(DecodeArgs, max_blocks) == 64, "DecodeArgs.max_blocks");
static_assert(offsetof(DecodeArgs, n_heads) == 68, "DecodeArgs.n_heads");
static_assert(offsetof(DecodeArgs, n_kv) == 72, "DecodeArgs.n_kv");
static_assert(offsetof(DecodeArgs, block_size) == 76, "DecodeArgs.block_size");
static_assert(offsetof(DecodeArgs, splits) == 80, "DecodeArgs.splits");
static_assert(offsetof(DecodeArgs, scale_log2) == 84, "DecodeArgs.scale_log2");

struct DecodeCombineArgs {
    const float* part_o;           // [S, n_heads, splits, D]
    const float* part_ml;          // [S, n_heads, splits, 2]
    const uint32_t* context_lens;  // [S]
    bf16* out;                     // [S, n_heads D]
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t splits;
    uint32_t pad;
};
static_assert(sizeof(DecodeCombineArgs) == 48, "DecodeCombineArgs layout");
static_assert(offsetof(DecodeCombineArgs, part_o) == 0, "DecodeCombineArgs.part_o");
static_assert(offsetof(DecodeCombineArgs, part_ml) == 8, "DecodeCombineArgs.part_ml");
static_assert(offsetof(DecodeCombineArgs, context_lens) == 16, "DecodeCombineArgs.context_lens");
static_assert(offsetof(DecodeCombineArgs, out) == 24, "DecodeCombineArgs.out");
static_assert(offsetof(DecodeCombineArgs, n_heads) == 32, "DecodeCombineArgs.n_heads");
static_assert(offsetof(DecodeCombineArgs, head_dim) == 36, "DecodeCombineArgs.head_dim");
static_assert(offsetof(DecodeCombineArgs, splits) == 40, "DecodeCombineArgs.splits");

// Keys per split for a context of `ctx` keys (>= DECODE_CHUNK_GRAN, also for ctx 0).
// decode_attention.rs `chunk_of` mirrors it.
__device__ __forceinline__ uint32_t decode_chunk(uint32_t ctx, uint32_t splits) {
    uint32_t c = (ctx + splits - 1) / splits;
    c = c > 0 ? c : 1;
    return (c + DECODE_CHUNK_GRAN - 1) / DECODE_CHUNK_GRAN * DECODE_CHUNK_GRAN;
}

// exp2(m - M) with an empty state (m = -inf) weighing 0, also when M = -inf.
__device__ __forceinline__ float decode_weight(float m, float M) { return m == -INFINITY ? 0.f : exp2f(m - M); }

__device__ __forceinline__ void load8(const bf16* p, float* f) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

template <int D, int C>
__device__ __forceinline__ void decode_attention_impl(const DecodeArgs& a) {
    constexpr int LPK = D / 8;   // lanes per key (8 bf16 = 16 bytes each)
    constexpr int KPW = 32 / LPK; // keys per warp per step
    constexpr int NW = DECODE_THREADS / 32;
    constexpr uint32_t STEP = NW * KPW; // keys per block per step
    static_assert(LPK >= 1 && LPK <= 32 && 32 % LPK == 0, "head dim");
    __shared__ float sm_ml[NW][C][2];
    __shared__ float sm_o[NW][C][D];

    const uint32_t split = blockIdx.x, s = blockIdx.y, kvh = blockIdx.z;
    const uint32_t G = a.n_heads / a.n_kv;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t ctx = a.context_lens[s];
    const uint32_t chunk = decode_chunk(ctx, a.splits);
    const uint32_t start = split * chunk;
    const uint32_t end = min(ctx, start + chunk);
    if (start >= end && a.splits > 1) return;  // uniform over the block; combine skips it

    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t ks = lane / LPK, part = lane % LPK;
    const size_t row = (size_t)(a.n_heads + 2 * a.n_kv) * D;
    const bf16* qrow = a.qkv + s * row + (size_t)kvh * G * D + part * 8;
    float q[C][8], acc[C][8], m[C], l[C];
#pragma unroll
    for (int g = 0; g < C; g++) {
        if (g < (int)G) {
            load8(qrow + g * D, q[g]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q[g][i] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            q[g][i] *= a.scale_log2;
            acc[g][i] = 0.f;
        }
        m[g] = -INFINITY;
        l[g] = 0.f;
    }

    const uint32_t* table = a.block_tables + (size_t)s * a.max_blocks;
    for (uint32_t base = start; base < end; base += STEP * DECODE_UNROLL) {
        float kf[DECODE_UNROLL][8], vf[DECODE_UNROLL][8];
        bool valid[DECODE_UNROLL];
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++) {
            const uint32_t j = base + u * STEP + warp * KPW + ks;
            valid[u] = j < end;
            if (valid[u]) {
                const size_t off = (kv_slot(table, j, a.block_size) * a.n_kv + kvh) * D + part * 8;
                load8(a.k_cache + off, kf[u]);
                load8(a.v_cache + off, vf[u]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) kf[u][i] = vf[u][i] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++) {
#pragma unroll
            for (int g = 0; g < C; g++) {
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(q[g][i], kf[u][i], dot);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (valid[u] && g < (int)G) {
                    const float mn = fmaxf(m[g], dot);
                    const float c = exp2f(m[g] - mn);  // 0 while m is -inf
                    const float p = exp2f(dot - mn);
                    l[g] = l[g] * c + p;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[g][i] = fmaf(acc[g][i], c, p * vf[u][i]);
                    m[g] = mn;
                }
            }
        }
    }

    // Merge the key slots of the warp (lanes with the same `part`).
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < C; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float M = fmaxf(m[g], mo);
            const float wa = decode_weight(m[g], M), wb = decode_weight(mo, M);
            l[g] = l[g] * wa + lo * wb;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
                acc[g][i] = acc[g][i] * wa + ao * wb;
            }
            m[g] = M;
        }
    }
    if (ks == 0) {
#pragma unroll
        for (int g = 0; g < C; g++) {
            if (g < (int)G) {
                if (part == 0) {
                    sm_ml[warp][g][0] = m[g];
                    sm_ml[warp][g][1] = l[g];
                }
#pragma unroll
                for (int i = 0; i < 8; i++) sm_o[warp][g][part * 8 + i] = acc[g][i];
            }
        }
    }
    __syncthreads();

    // Merge the warps: one thread per (head, dim).
    for (uint32_t e = threadIdx.x; e < G * D; e += DECODE_THREADS) {
        const uint32_t g = e / D, d = e % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) M = fmaxf(M, sm_ml[w][g][0]);
        float L = 0.f, O = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float wt = decode_weight(sm_ml[w][g][0], M);
            L += sm_ml[w][g][1] * wt;
            O += sm_o[w][g][d] * wt;
        }
        const uint32_t h = kvh * G + g;
        if (a.splits == 1) {
            a.out[((size_t)s * a.n_heads + h) * D + d] = f2bf(L > 0.f ? O / L : 0.f);
        } else {
            const size_t idx = ((size_t)s * a.n_heads + h) * a.splits + split;
            a.part_o[idx * D + d] = O;
            if (d == 0) {
                a.part_ml[idx * 2] = M;
                a.part_ml[idx * 2 + 1] = L;
            }
        }
    }
}

#define DECODE_ATTENTION(D, C)                                                                  \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS) decode_attention_d##D##_g##C( \
        const DecodeArgs a) {                                                                   \
        decode_attention_impl<D, C>(a);                                                         \
    }
DECODE_ATTENTION(16, 4)
DECODE_ATTENTION(16, 8)
DECODE_ATTENTION(32, 4)
DECODE_ATTENTION(32, 8)
DECODE_ATTENTION(64, 4)
DECODE_ATTENTION(64, 8)
DECODE_ATTENTION(128, 4)
DECODE_ATTENTION(128, 8)

extern "C" __global__ void decode_combine(const DecodeCombineArgs a) {
    const uint32_t s = blockIdx.x, h = blockIdx.y;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t ctx = a.context_lens[s];
    const uint32_t chunk = decode_chunk(ctx, a.splits);
    const uint32_t ns = min((ctx + chunk - 1) / chunk, a.splits);
    const size_t base = ((size_t)s * a.n_heads + h) * a.splits;
    float M = -INFINITY;
    for (uint32_t i = 0; i < ns; i++) M = fmaxf(M, a.part_ml[(base + i) * 2]);
    float L = 0.f;
    for (uint32_t i = 0; i < ns; i++) L += a.part_ml[(base + i) * 2 + 1] * decode_weight(a.part_ml[(base + i) * 2], M);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    for (uint32_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float o = 0.f;
        for (uint32_t i = 0; i < ns; i++)
            o += a.part_o[(base + i) * a.head_dim + d] * decode_weight(a.part_ml[(base + i) * 2], M);
        a.out[((size_t)s * a.n_heads + h) * a.head_dim + d] = f2bf(o * inv);
    }
}
