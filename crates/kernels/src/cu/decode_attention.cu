// Decode attention: one query token per sequence, paged, GQA-aware,
// flash-decoding with a device-side chunk so the work follows the real
// context, not the longest context a captured graph may meet.
//
// decode_attention_dD_gC: grid (splits, rows, n_kv), LAMINA_DECODE_THREADS threads.
//   A row is a sequence (context_lens[row] keys), or, with `positions` set,
//   a token row of a segment (`cu_seqlens`): positions[row] + 1 keys of its
//   sequence, so a prompt's tokens run exactly as decode rows would.
//   `splits` is fixed on the host from S (enough blocks to fill the GPU);
//   each block computes its key range from the device-side context length:
//   A row reads keys [lo, ctx): lo = window_first(ctx - 1, window) (0 without
//   a sliding window), so whole blocks older than the window are never read
//   and a windowed row costs O(window) whatever its context. Over the
//   n = ctx - lo keys,
//   chunk = round_up(max(ceil(n / splits), min_chunk), LAMINA_DECODE_CHUNK_GRAN),
//   keys [lo + split*chunk, min(ctx, lo + (split+1)*chunk)); blocks past the
//   context exit, so ns = ceil(n / chunk) splits do the work (one split up to
//   min_chunk keys, whatever `splits` is).
//   Within a block, each key is read by D/8 lanes (one 16-byte uint4 of K and
//   of V each), so a warp works on 32/(D/8) keys at once (at D = 256 the
//   whole warp on one key, 8 values a lane as at every D); every K/V load
//   serves all G = n_heads/n_kv query heads of the group (G <= C). Each lane
//   group keeps an online softmax (log2 domain: q is pre-scaled by
//   log2(e) times the layer's score scale); states are merged across the warp with shuffles, then
//   across warps in shared memory. A block alone on its (sequence, KV head)
//   (ns == 1) writes the normalised bf16 output; otherwise it writes
//   un-normalised partials + (max, sum), and the last of the ns blocks to
//   finish (a per-(sequence, KV head) arrival counter, reset by that block)
//   merges them in split order: no second launch, same result whichever
//   block finishes last.
// decode_attention_fp8_dD_gC reads e4m3 caches (kv.cuh): a lane's 8 elements
// are 8 bytes; k_scale is folded into q's scale, V widened times v_scale.
#include "common.cuh"
#include "kv.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"
#include "sched.cuh"

// LAMINA_DECODE_THREADS (src/consts.rs) is 128: a block fits beside the QKV
// GEMV's blocks, so it is resident, its first keys loaded, before that
// kernel ends. (256 threads holding 8 keys per lane group ran alone faster,
// 5.7 vs 8.1 us at batch 1 and 200 keys, but lost 2% of a batch-1 step: 1
// block per SM no longer overlaps the QKV GEMV.) Each lane group loads
// LAMINA_DECODE_UNROLL keys before using them (memory-level parallelism), so
// a block loads U * STEP keys a batch (64 at D = 64, 32 at 128, 16 at 256),
// its first batch before the PDL wait. The host's default fewest keys a
// split takes (DecodeArgs.min_chunk, decode_attention.rs
// `default_min_chunk`) is one such batch, at most 64: short contexts then
// run on more blocks whose keys are all loaded before the wait. (At D = 64,
// 128 and 256 were slower at batch 1: every key past the first 64 of a
// split is loaded after the PDL wait.)
// Splits whose partials the merging block loads before using them.
constexpr int DECODE_MERGE_UNROLL = 4;

// Keys per split for a context of `ctx` keys (>= min_chunk, also for ctx 0).
// decode_attention.rs `chunk_of` mirrors it.
__device__ __forceinline__ uint32_t decode_chunk(uint32_t ctx, uint32_t splits, uint32_t min_chunk) {
    uint32_t c = (ctx + splits - 1) / splits;
    c = c > min_chunk ? c : min_chunk;
    return (c + LAMINA_DECODE_CHUNK_GRAN - 1) / LAMINA_DECODE_CHUNK_GRAN * LAMINA_DECODE_CHUNK_GRAN;
}

// The segment of token row `row`: the last q < n with cu[q] <= row.
__device__ __forceinline__ uint32_t decode_segment(const uint32_t* cu, uint32_t n, uint32_t row) {
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (ld_before_wait_u32(cu + mid) <= row) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// exp2(m - M) with an empty state (m = -inf) weighing 0, also when M = -inf.
__device__ __forceinline__ float decode_weight(float m, float M) { return m == -INFINITY ? 0.f : exp2f(m - M); }


template <class S>
__device__ __forceinline__ void load8(const bf16* p, float* f) {
    const uint4 raw = sched_ld16<S>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// How a lane loads and widens its 8 elements of a K or V row.
template <typename KV>
struct DecodeKv;
template <>
struct DecodeKv<bf16> {
    typedef uint4 raw;
    __device__ static raw zero() { return make_uint4(0, 0, 0, 0); }
    __device__ static raw before_wait(const bf16* p) { return ld_before_wait(p); }
    template <class S>
    __device__ static raw load(const bf16* p) {
        return sched_ld16<S>(p);
    }
    __device__ static void widen(const raw r, float* f, float) { bf8(r, f); }
};
template <>
struct DecodeKv<uint8_t> {
    typedef uint2 raw;
    __device__ static raw zero() { return make_uint2(0, 0); }
    __device__ static raw before_wait(const uint8_t* p) { return ld_before_wait8(p); }
    template <class S>
    __device__ static raw load(const uint8_t* p) {
        const uint2* q = reinterpret_cast<const uint2*>(p);
        return S::COHERENT ? __ldcg(q) : __ldg(q);
    }
    __device__ static void widen(const raw r, float* f, float scale) { kv_fp8x8_to_float(r, f, scale); }
};

// The block of (split, query row s, KV head kvh); `sched` how it waits for
// earlier work and reads its outputs (sched.cuh).
template <int D, int C, typename KV, class S>
__device__ __forceinline__ void decode_attention_impl(const DecodeArgs& a, uint32_t split, uint32_t s, uint32_t kvh,
                                                      const S& sched) {
    typedef DecodeKv<KV> L;
    constexpr bool FP8 = sizeof(KV) == 1;
    const KV* __restrict__ k_cache = static_cast<const KV*>(a.k_cache);
    const KV* __restrict__ v_cache = static_cast<const KV*>(a.v_cache);
    const float v_scale = FP8 ? a.v_scale : 1.f;
    constexpr int LPK = D / 8;   // lanes per key (8 bf16 = 16 bytes each)
    constexpr int KPW = 32 / LPK; // keys per warp per step
    constexpr int NW = LAMINA_DECODE_THREADS / 32;
    constexpr uint32_t STEP = NW * KPW; // keys per block per step
    constexpr int U = LAMINA_DECODE_UNROLL;
    static_assert(LPK >= 1 && LPK <= 32 && 32 % LPK == 0, "head dim");
    __shared__ float sm_ml[NW][C][2];
    __shared__ float sm_o[NW][C][D];

    // s: the query row (a sequence, or a token row of a segment)
    const uint32_t G = a.n_heads / a.n_kv;
    // Context lengths, positions and block tables are staged before the
    // step's first kernel, so the key range and the cache slots are known
    // before the PDL wait. Keys from `first_new` on were written by this
    // step's previous kernels: they are read after the wait.
    uint32_t seq = s, ctx, first_new;
    if (a.positions != nullptr) {
        seq = decode_segment(a.cu_seqlens, a.num_seqs, s);
        ctx = ld_before_wait_u32(a.positions + s) + 1;
        first_new = ld_before_wait_u32(a.positions + ld_before_wait_u32(a.cu_seqlens + seq));
    } else {
        ctx = ld_before_wait_u32(a.context_lens + s);
        first_new = ctx > a.fresh ? ctx - a.fresh : 0;
    }
    if (ctx < a.min_ctx) return;  // left to another launch; uniform over the block
    // keys [lo, ctx): the row's window (ctx 0: none, lo 0)
    const uint32_t lo = ctx > 0 ? window_first(ctx - 1, a.window) : 0;
    const uint32_t nkeys = ctx - lo;
    const uint32_t chunk = decode_chunk(nkeys, a.splits, a.min_chunk);
    const uint32_t start = lo + split * chunk;
    const uint32_t end = min(ctx, start + chunk);
    // Splits with keys (at least one, so an empty context still writes zeros).
    const uint32_t ns = max(1u, min((nkeys + chunk - 1) / chunk, a.splits));
    if (split >= ns) return;  // uniform over the block; never counted
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t ks = lane / LPK, part = lane % LPK;
    const uint32_t* table = a.block_tables + (size_t)seq * a.max_blocks;
    // The first U steps' keys are loaded before the PDL wait, all but the
    // fresh ones (from first_new on), which are final only after it.
    typename L::raw kr[U], vr[U];
    size_t off[U];
    bool valid[U];
    // (All table entries first, then all K/V rows: these loads keep their
    // program order, so interleaving them would serialise the round trips.)
    uint32_t blk[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t j = start + u * STEP + warp * KPW + ks;
        valid[u] = j < end;
        blk[u] = valid[u] ? ld_before_wait_u32(table + j / a.block_size) : 0;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t j = start + u * STEP + warp * KPW + ks;
        kr[u] = vr[u] = L::zero();
        off[u] = (((size_t)blk[u] * a.block_size + j % a.block_size) * a.n_kv + kvh) * D + part * 8;
        if (valid[u] && j < first_new) {
            kr[u] = L::before_wait(k_cache + off[u]);
            vr[u] = L::before_wait(v_cache + off[u]);
        }
    }
    sched.wait();
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (valid[u] && start + u * STEP + warp * KPW + ks >= first_new) {
            kr[u] = L::template load<S>(k_cache + off[u]);
            vr[u] = L::template load<S>(v_cache + off[u]);
        }
    }

    const size_t row = (size_t)(a.n_heads + 2 * a.n_kv) * D;
    const bf16* qrow = a.qkv + s * row + (size_t)kvh * G * D + part * 8;
    float q[C][8], acc[C][8], m[C], l[C];
#pragma unroll
    for (int g = 0; g < C; g++) {
        if (g < (int)G) {
            load8<S>(qrow + g * D, q[g]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q[g][i] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            q[g][i] *= FP8 ? a.scale_log2 * a.k_scale : a.scale_log2;
            acc[g][i] = 0.f;
        }
        m[g] = -INFINITY;
        l[g] = 0.f;
    }

    // Online softmax over one batch of U keys per lane group.
    auto consume = [&]() {
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8], vf[8];
            L::widen(kr[u], kf, 1.f);
            L::widen(vr[u], vf, v_scale);
#pragma unroll
            for (int g = 0; g < C; g++) {
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(q[g][i], kf[i], dot);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (valid[u] && g < (int)G) {
                    const float mn = fmaxf(m[g], dot);
                    const float c = exp2f(m[g] - mn);  // 0 while m is -inf
                    const float p = exp2f(dot - mn);
                    l[g] = l[g] * c + p;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[g][i] = fmaf(acc[g][i], c, p * vf[i]);
                    m[g] = mn;
                }
            }
        }
    };
    consume();
    for (uint32_t base = start + STEP * U; base < end; base += STEP * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t j = base + u * STEP + warp * KPW + ks;
            valid[u] = j < end;
            kr[u] = vr[u] = L::zero();
            if (valid[u]) {
                const size_t o = (kv_slot(table, j, a.block_size) * a.n_kv + kvh) * D + part * 8;
                kr[u] = L::template load<S>(k_cache + o);
                vr[u] = L::template load<S>(v_cache + o);
            }
        }
        consume();
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
    for (uint32_t e = threadIdx.x; e < G * D; e += LAMINA_DECODE_THREADS) {
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
        if (ns == 1) {
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
    if (ns == 1) return;

    // The last of the ns blocks merges the partials of the G heads.
    __shared__ uint32_t sm_last;
    // Release this block's partials before its arrival; the last block's
    // acquire fence below pairs with it through the counter.
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t* cnt = a.counters + (size_t)s * a.n_kv + kvh;
        const uint32_t arrived = atomicAdd(cnt, 1u) + 1;
        sm_last = arrived == ns;
        if (arrived == ns) *cnt = 0;  // ready for the next launch
    }
    __syncthreads();
    if (!sm_last) return;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    // Each thread merges four adjacent outputs of one head over the ns
    // partials in split order (an online softmax of the partial states):
    // one (max, sum) pair and one float4 of partial outputs a split, loaded
    // DECODE_MERGE_UNROLL splits at a time.
    static_assert(D % 4 == 0, "head dim");
    for (uint32_t e = threadIdx.x * 4; e < G * D; e += LAMINA_DECODE_THREADS * 4) {
        const uint32_t g = e / D, d = e % D;
        const size_t base = ((size_t)s * a.n_heads + kvh * G + g) * a.splits;
        const float2* ml = reinterpret_cast<const float2*>(a.part_ml) + base;
        const float4* po = reinterpret_cast<const float4*>(a.part_o + base * D + d);
        float M = -INFINITY, L = 0.f;
        float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll DECODE_MERGE_UNROLL
        for (uint32_t i = 0; i < ns; i++) {
            const float2 p = __ldcg(ml + i);
            const float4 o = __ldcg(po + (size_t)i * (D / 4));
            const float Mn = fmaxf(M, p.x);
            const float wa = decode_weight(M, Mn), wb = decode_weight(p.x, Mn);
            L = L * wa + p.y * wb;
            O = make_float4(O.x * wa + o.x * wb, O.y * wa + o.y * wb, O.z * wa + o.z * wb, O.w * wa + o.w * wb);
            M = Mn;
        }
        bf16* out = a.out + ((size_t)s * a.n_heads + kvh * G + g) * D + d;
        out[0] = f2bf(L > 0.f ? O.x / L : 0.f);
        out[1] = f2bf(L > 0.f ? O.y / L : 0.f);
        out[2] = f2bf(L > 0.f ? O.z / L : 0.f);
        out[3] = f2bf(L > 0.f ? O.w / L : 0.f);
    }
}

#define DECODE_ATTENTION(D, C)                                                                  \
    extern "C" __global__ void __launch_bounds__(LAMINA_DECODE_THREADS) decode_attention_d##D##_g##C( \
        const DecodeArgs a) {                                                                   \
        decode_attention_impl<D, C, bf16>(a, blockIdx.x, blockIdx.y, blockIdx.z, LaunchSched{}); \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(LAMINA_DECODE_THREADS) decode_attention_fp8_d##D##_g##C( \
        const DecodeArgs a) {                                                                   \
        decode_attention_impl<D, C, uint8_t>(a, blockIdx.x, blockIdx.y, blockIdx.z, LaunchSched{}); \
    }
DECODE_ATTENTION(16, 4)
DECODE_ATTENTION(16, 8)
DECODE_ATTENTION(32, 4)
DECODE_ATTENTION(32, 8)
DECODE_ATTENTION(64, 4)
DECODE_ATTENTION(64, 8)
DECODE_ATTENTION(128, 4)
DECODE_ATTENTION(128, 8)
DECODE_ATTENTION(256, 4)
DECODE_ATTENTION(256, 8)
