// Flash prefill attention on tensor cores (FlashAttention-2 structure):
// causal, packed variable-length sequences, GQA, every key and value read
// from the paged cache (the chunk's own K/V were written there first).
//
// Grid (n_kv, S, ceil(max_seqlen / tok_per_tile)). A CTA serves tok_per_tile
// query tokens x the G = n_heads / n_kv query heads of one KV head, packed
// into BM = 16 * MT * WARPS rows (row r = token r / G, head r % G), so each
// K/V tile load serves all G heads; warp w owns MT m16 tiles (rows 16 MT w ..
// 16 MT (w + 1) - 1), so every K/V fragment it reads from shared memory feeds
// MT MMAs. Two tilings: flash_prefill_dD (LAMINA_FLASH_*: 4 warps x 2 m16 tiles = 128
// rows, prefill) and flash_narrow_dD (LAMINA_FLASH_NARROW_*: one warp, 16 rows, decode rows:
// one token x G heads a sequence, without 112 rows of padding). A CTA whose
// sequence's query length lies outside [min_len, max_len] exits (a mixed
// step sends its one-token segments to the narrow launch).
// Query i of sequence s sits at position context_len - seqlen + i and
// attends to positions window_first(that, window)..=that (0..=that without a
// sliding window); a CTA starts at the key tile of its first query's window,
// so tiles wholly before every window of its rows are never loaded.
// Per 64-key tile (BN): K and V are gathered through the block table with
// 16-byte cp.async copies into XOR-swizzled shared memory (double-buffered:
// tile n+1 loads while tile n computes), S = Q Kᵀ and O += P V run on
// mma.sync m16n8k16 bf16 (f32 accumulate) with ldmatrix operands (.trans for
// V), the online softmax stays in registers (max over raw scores, then
// p = 2^(s * scale - m) in one FFMA and ex2.approx.ftz), the causal and
// window mask is applied only on tiles that reach past the CTA's first query
// position or before its last query's window, and tiles past its last query
// position are never loaded. Keys past the end are
// zero-filled (and those before the CTA's first window: their blocks may be
// released), padding rows (past the sequence, or past tok_per_tile * G)
// are computed on zero queries and never stored. Query tiles are the grid's
// slowest dimension, reversed, so the heaviest (last) tiles of every sequence
// and KV head start first and the light ones fill the tail. Deterministic: no
// atomics, fixed order.
// Shared memory: (BM + 4 BN) * D bf16 (48 KiB wide / 34 KiB narrow at D = 64).
// FP8 caches (the *_fp8_dD entries, KV = uint8_t): the cp.async copies move
// e4m3 bytes (16 a copy) into double-buffered byte tiles; at the top of each
// tile the CTA widens tile n's bytes into one bf16 K and one bf16 V tile
// (exact: every e4m3 value is a bf16) and the MMAs run as for bf16, with
// k_scale folded into the softmax scale and v_scale into the output's
// normalisation. Same shared memory: BM * D * 2 + 2 * BN * D * 2 + 2 * 2 * BN * D.
#include <stddef.h>

#include "common.cuh"
#include "cp_async.cuh"
#include "kv.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "wgmma.cuh"

// Wide tiling: LAMINA_FLASH_THREADS / 32 warps of LAMINA_FLASH_M_TILES m16
// tiles, LAMINA_FLASH_KEYS-key tiles (measured on the H200, 4,096-token
// causal prompt, D = 64: 4 warps x 2 m16 tiles 224 TFLOP/s; 8 warps x 1:
// 199; 4 x 2 with 32-key tiles: 184).
static_assert(16 * LAMINA_FLASH_M_TILES * (LAMINA_FLASH_THREADS / 32) == LAMINA_FLASH_ROWS,
              "wide flash tiling: rows = 16 x m-tiles x warps");
// Narrow tiling: one warp, one m16 tile, for decode rows at large batch
// (256 sequences x 640 keys: 95 us against the split-KV decode kernel's 154;
// 32-key tiles with 4 stages or 64 with 3 were not faster in `lamina bench`).
// Smaller-tile narrow variants (flash_narrow_small_dD: 32-key tiles,
// flash_narrow_tiny_dD: 16): less shared memory, more CTAs an SM holds, more
// loop overhead a key. The launcher takes the largest tile whose CTAs all fit
// on the device at once (H200, D = 64: S = 128 x 1,000 keys: 64 keys 91.3 us,
// 32 keys 69.5, 16 keys 77.1; S = 256 x 640: 96.5 / 94.1 / 81.3; below one
// wave the small tiles are slower: S = 64 x 500: 23.9 / 27.4 / 24.0).
static_assert(LAMINA_FLASH_NARROW_THREADS == 32 && LAMINA_FLASH_NARROW_ROWS == 16,
              "narrow flash tiling: one warp, one m16 tile");

extern __shared__ uint4 fp_smem[];


__device__ __forceinline__ void fp_ldsm(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void fp_ldsm_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// c += a (16x16, row) * b (16x8, col), bf16 in, f32 accumulate.
__device__ __forceinline__ void fp_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x on the MUFU unit, denormal results flushed to zero (exp2f would add a
// range check and two multiplies per call); 2^-inf = 0.
__device__ __forceinline__ float fp_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t fp_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
// Element offset of 16-byte chunk `c` of row `r` in a swizzled [rows][D] tile:
// the chunk index is XORed with r % 8, so the 8 rows one ldmatrix phase reads
// at one logical chunk hit 8 distinct bank groups.
template <int D>
__device__ __forceinline__ uint32_t fp_swz(uint32_t r, uint32_t c) {
    return r * D + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ void fp_st16(uint32_t addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// FP8 caches: gathers the e4m3 bytes of keys kt.. (BN rows of D bytes, [BN][D]
// unswizzled) of K and V through the block table into kr / vr with 16-byte
// cp.async copies; keys outside [klo, kend) are zero-filled (their table
// entries never read).
template <int D, int BN, int THREADS>
__device__ __forceinline__ void fp8_load_raw(const FlashPrefillArgs& a, const uint32_t* table, uint32_t kvh,
                                             uint32_t kt, uint32_t klo, uint32_t kend, uint32_t kr, uint32_t vr,
                                             uint32_t tid) {
    constexpr int CB = D / 16;  // 16-byte chunks of e4m3 per row
    static_assert((BN * CB) % THREADS == 0 && THREADS % CB == 0, "whole FP8 K/V tile rows per pass");
    const uint32_t bs = a.block_size;
    const uint8_t* kc = static_cast<const uint8_t*>(a.k_cache);
    const uint8_t* vc = static_cast<const uint8_t*>(a.v_cache);
#pragma unroll
    for (int it = 0; it < BN * CB / THREADS; it++) {
        const uint32_t j = tid / CB + it * (THREADS / CB), c = tid % CB, pos = kt + j;
        const bool valid = pos >= klo && pos < kend;
        const size_t slot = valid ? (size_t)table[pos / bs] * bs + pos % bs : 0;
        const size_t off = (slot * a.num_kv_heads + kvh) * D + c * 16;
        cp16(kr + j * D + c * 16, kc + off, valid);
        cp16(vr + j * D + c * 16, vc + off, valid);
    }
}

// FP8 caches: widens the byte tiles kr / vr ([BN][D]) into the bf16 tiles at
// shared addresses kd / vd, chunk c (8 elements) of row j at byte offset
// off(j, c) (the tiling's swizzle).
template <int D, int BN, int THREADS, typename Off>
__device__ __forceinline__ void fp8_widen_tile(uint32_t kr, uint32_t vr, uint32_t kd, uint32_t vd, uint32_t tid,
                                               Off off) {
    constexpr int CB = D / 16;
    for (uint32_t i = tid; i < (uint32_t)(BN * CB); i += THREADS) {
        const uint32_t j = i / CB, c = i % CB;
        uint4 k8, v8;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(k8.x), "=r"(k8.y), "=r"(k8.z), "=r"(k8.w)
                     : "r"(kr + j * D + c * 16));
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v8.x), "=r"(v8.y), "=r"(v8.z), "=r"(v8.w)
                     : "r"(vr + j * D + c * 16));
        fp_st16(kd + off(j, 2 * c), kv_fp8x8_to_bf16x8(make_uint2(k8.x, k8.y)));
        fp_st16(kd + off(j, 2 * c + 1), kv_fp8x8_to_bf16x8(make_uint2(k8.z, k8.w)));
        fp_st16(vd + off(j, 2 * c), kv_fp8x8_to_bf16x8(make_uint2(v8.x, v8.y)));
        fp_st16(vd + off(j, 2 * c + 1), kv_fp8x8_to_bf16x8(make_uint2(v8.z, v8.w)));
    }
}

// One key tile's causal and window mask and online-softmax update for one
// thread's two accumulator rows (fragment rows lane / 4 and lane / 4 + 8 of
// an m16 tile, at positions qpos[0..2], seeing keys qlo[i]..=qpos[i]), shared
// by every tiling. sc [BN / 8][4] holds the
// raw scores of keys kt.. in the m16n8 accumulator layout and becomes the
// bf16-packed P in pa [BN / 16][4] (the m16n8k16 A layout); m, l and the
// output o [OB][4] are rescaled. Max over raw scores (the scale is
// positive), then p = 2^(s * scale - m) in one FFMA; the mask is applied
// only on tiles that reach past the CTA's first query position min_pos or
// before max_lo (the window start of its last row). A row that sees no key
// yet (a window starting past this tile) keeps m = -inf and weighs 0.
template <int BN, int OB>
__device__ __forceinline__ void fp_softmax_tile(float (&sc)[BN / 8][4], float (&o)[OB][4], float (&m)[2], float (&l)[2],
                                                uint32_t (&pa)[BN / 16][4], const uint32_t (&qpos)[2],
                                                const uint32_t (&qlo)[2], uint32_t kt, uint32_t min_pos,
                                                uint32_t max_lo, uint32_t lane, float scale_log2) {
    if (kt + BN - 1 > min_pos || kt < max_lo) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t key = kt + j * 8 + (lane % 4) * 2 + (e & 1);
                if (key > qpos[e >> 1] || key < qlo[e >> 1]) sc[j][e] = -INFINITY;
            }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
    float corr[2], rs[2] = {0.f, 0.f}, neg_m[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i] * scale_log2);
        // 0 on a row's first tile with keys (m = -inf, mn finite); a row with
        // no key so far (mn = -inf) keeps o = l = 0 and gets p = 2^-inf = 0
        const bool none = mn == -INFINITY;
        corr[i] = none ? 1.f : fp_exp2(m[i] - mn);
        m[i] = mn;
        neg_m[i] = none ? 0.f : -mn;
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = fp_exp2(fmaf(sc[j][e], scale_log2, neg_m[e >> 1]));
            sc[j][e] = p;
            rs[e >> 1] += p;
        }
#pragma unroll
    for (int i = 0; i < 2; i++) l[i] = l[i] * corr[i] + rs[i];
#pragma unroll
    for (int j = 0; j < OB; j++) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
    }
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) {
        pa[kc][0] = fp_pack(sc[2 * kc][0], sc[2 * kc][1]);
        pa[kc][1] = fp_pack(sc[2 * kc][2], sc[2 * kc][3]);
        pa[kc][2] = fp_pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]);
        pa[kc][3] = fp_pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3]);
    }
}

template <int D, int WARPS, int MT, int BN, typename KV>
__device__ __forceinline__ void flash_prefill_impl(const FlashPrefillArgs& a) {
    constexpr int BM = 16 * MT * WARPS, THREADS = 32 * WARPS;
    static_assert(D % 16 == 0 && D >= 64, "head dim: multiple of 16, at least 64 (8 chunks for the swizzle)");
    constexpr int CH = D / 8;  // 16-byte chunks per row
    constexpr bool FP8 = sizeof(KV) == 1;
    constexpr int KB = FP8 ? 1 : 2;               // bf16 K/V buffers
    bf16* Qs = reinterpret_cast<bf16*>(fp_smem);  // [BM][D]
    bf16* Ks = Qs + BM * D;                       // [KB][BN][D]
    bf16* Vs = Ks + KB * BN * D;                  // [KB][BN][D]
    // FP8 only: e4m3 bytes, [2][BN][D] each
    const uint32_t Kr = smem_addr(Vs + KB * BN * D), Vr = Kr + 2 * BN * D;
    const float scale_log2 = FP8 ? a.scale_log2 * a.k_scale : a.scale_log2;
    const float out_scale = FP8 ? a.v_scale : 1.f;

    const uint32_t G = a.num_heads / a.num_kv_heads;
    const uint32_t kvh = blockIdx.x, s = blockIdx.y;
    const uint32_t seq0 = a.cu_seqlens[s], len = a.cu_seqlens[s + 1] - seq0;
    const uint32_t tok0 = (gridDim.z - 1 - blockIdx.z) * a.tok_per_tile;
    if (tok0 >= len || len < a.min_len || len > a.max_len) return;  // uniform over the CTA
    const uint32_t first_pos = a.context_lens[s] - len;
    const uint32_t ntok = min(a.tok_per_tile, len - tok0);
    const uint32_t rows = ntok * G;
    const uint32_t min_pos = first_pos + tok0;  // first query's position
    if (min_pos >= a.max_ctx) return;           // every row's context exceeds max_ctx
    const uint32_t kend = min_pos + ntok;       // keys 0..kend are needed
    const uint32_t ntiles = (kend + BN - 1) / BN;
    // the first query's window starts the earliest (klo): its tile is the
    // first loaded, its keys before klo zero-filled (a table entry before
    // every window of the step may name a block released to other sequences)
    const uint32_t klo = window_first(min_pos, a.window), n0 = klo / BN;
    const uint32_t max_lo = window_first(kend - 1, a.window);
    const size_t row_stride = (size_t)(a.num_heads + 2 * a.num_kv_heads) * D;
    const uint32_t* table = a.block_tables + (size_t)s * a.max_blocks;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    for (uint32_t i = tid; i < BM * CH; i += THREADS) {
        const uint32_t r = i / CH, c = i % CH;
        const bool valid = r < rows;
        const uint32_t t = valid ? r / G : 0, g = valid ? r % G : 0;
        const bf16* src = a.qkv + (size_t)(seq0 + tok0 + t) * row_stride + (size_t)(kvh * G + g) * D + c * 8;
        cp16(smem_addr(Qs + fp_swz<D>(r, c)), src, valid);
    }
    // Block sizes that are powers of two (all in practice) index by shift and mask.
    const uint32_t bs = a.block_size;
    const bool pow2 = (bs & (bs - 1)) == 0;
    const uint32_t bshift = __ffs(bs) - 1;
    auto load_kv = [&](uint32_t kt, uint32_t buf) {
        if constexpr (FP8) {
            fp8_load_raw<D, BN, THREADS>(a, table, kvh, kt, klo, kend, Kr + buf * BN * D, Vr + buf * BN * D, tid);
            return;
        }
        bf16* kd = Ks + buf * BN * D;
        bf16* vd = Vs + buf * BN * D;
        const bf16* kc = static_cast<const bf16*>(a.k_cache);
        const bf16* vc = static_cast<const bf16*>(a.v_cache);
        static_assert((BN * CH) % THREADS == 0 && THREADS % CH == 0, "whole K/V tile rows per pass");
#pragma unroll 4
        for (int it = 0; it < BN * CH / THREADS; it++) {
            // this thread's chunk c of key rows tid / CH + it * THREADS / CH
            const uint32_t j = tid / CH + it * (THREADS / CH), c = tid % CH, pos = kt + j;
            const bool valid = pos >= klo && pos < kend;
            const uint32_t blk = pow2 ? pos >> bshift : pos / bs, in = pow2 ? pos & (bs - 1) : pos % bs;
            const size_t slot = valid ? (size_t)table[blk] * bs + in : 0;
            const size_t off = (slot * a.num_kv_heads + kvh) * D + c * 8;
            cp16(smem_addr(kd + fp_swz<D>(j, c)), kc + off, valid);
            cp16(smem_addr(vd + fp_swz<D>(j, c)), vc + off, valid);
        }
    };
    load_kv(n0 * BN, n0 & 1);
    cp_commit();

    // This thread's fragment rows (lane / 4 and lane / 4 + 8 of each of its
    // m16 tiles), their positions and window starts; padding rows take the
    // last valid row's.
    const uint32_t wrow = warp * 16 * MT;
    uint32_t qpos[MT][2], qlo[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t r = min(wrow + mt * 16 + lane / 4 + 8 * i, rows - 1);
            qpos[mt][i] = min_pos + r / G;
            qlo[mt][i] = window_first(qpos[mt][i], a.window);
        }
    float o[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < D / 8; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
    // Q fragments stay in registers up to D * MT = 128; beyond (D = 128 with
    // two m16 tiles) they would not fit beside o and the scores (spills), so
    // they are re-read from shared memory per tile there (+25% smem reads).
    constexpr bool QREG = D * MT <= 128;
    uint32_t qf[MT][QREG ? D / 16 : 1][4];

    for (uint32_t n = n0; n < ntiles; n++) {
        cp_wait_all();
        __syncthreads();  // tile n (and Q) visible; every warp is done with tile n - 1
        if (QREG && n == n0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    fp_ldsm(qf[mt][QREG ? kk : 0], smem_addr(Qs + fp_swz<D>(wrow + mt * 16 + lane % 16, kk * 2 + lane / 16)));
        }
        if constexpr (FP8) {
            fp8_widen_tile<D, BN, THREADS>(Kr + (n & 1) * BN * D, Vr + (n & 1) * BN * D, smem_addr(Ks), smem_addr(Vs),
                                           tid, [](uint32_t r, uint32_t c) { return 2 * fp_swz<D>(r, c); });
        }
        if (n + 1 < ntiles) load_kv((n + 1) * BN, (n + 1) & 1);
        cp_commit();
        if constexpr (FP8) __syncthreads();  // the widened tile n visible
        const bf16* K = Ks + (FP8 ? 0 : n & 1) * BN * D;
        const bf16* V = Vs + (FP8 ? 0 : n & 1) * BN * D;

        float sc[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BN / 8; j++) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            if (!QREG) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    fp_ldsm(qf[mt][0], smem_addr(Qs + fp_swz<D>(wrow + mt * 16 + lane % 16, kk * 2 + lane / 16)));
            }
#pragma unroll
            for (int nb = 0; nb < BN / 16; nb++) {
                uint32_t b[4];
                fp_ldsm(b, smem_addr(K + fp_swz<D>(nb * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fp_mma(sc[mt][2 * nb], qf[mt][QREG ? kk : 0], b[0], b[1]);
                    fp_mma(sc[mt][2 * nb + 1], qf[mt][QREG ? kk : 0], b[2], b[3]);
                }
            }
        }

        uint32_t pa[MT][BN / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            fp_softmax_tile<BN, D / 8>(sc[mt], o[mt], m[mt], l[mt], pa[mt], qpos[mt], qlo[mt], n * BN, min_pos,
                                       max_lo, lane, scale_log2);

#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
#pragma unroll
            for (int db = 0; db < D / 16; db++) {
                uint32_t b[4];
                fp_ldsm_t(b, smem_addr(V + fp_swz<D>(kc * 16 + ((lane / 8) % 2) * 8 + lane % 8, db * 2 + lane / 16)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fp_mma(o[mt][2 * db], pa[mt][kc], b[0], b[1]);
                    fp_mma(o[mt][2 * db + 1], pa[mt][kc], b[2], b[3]);
                }
            }
        }
    }
    cp_wait_all();

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            const uint32_t r = wrow + mt * 16 + lane / 4 + 8 * i;
            if (r >= rows || min_pos + r / G >= a.max_ctx) continue;
            const float inv = out_scale / li;
            const uint32_t t = r / G, g = r % G;
            bf16* dst =
                a.out + (size_t)(seq0 + tok0 + t) * a.num_heads * D + (size_t)(kvh * G + g) * D + (lane % 4) * 2;
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                *reinterpret_cast<__nv_bfloat162*>(dst + j * 8) =
                    __floats2bfloat162_rn(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
        }
}

// The wide tiling serves D = 64 and 128 only: at D = 256 its two m16 tiles a
// warp would hold 256 f32 accumulators a thread (spills) and 192 KiB of
// tiles; the narrow tilings (one m16 tile, Q re-read from shared memory)
// and the Hopper tiling serve 256 too.
#define FLASH_WIDE(D, SUF, KV)                                                                              \
    extern "C" __global__ void __launch_bounds__(LAMINA_FLASH_THREADS) flash_prefill##SUF##_d##D(const FlashPrefillArgs a) {  \
        flash_prefill_impl<D, LAMINA_FLASH_THREADS / 32, LAMINA_FLASH_M_TILES, LAMINA_FLASH_KEYS, KV>(a);                      \
    }
#define FLASH_NARROW(D, SUF, KV)                                                                            \
    extern "C" __global__ void __launch_bounds__(LAMINA_FLASH_NARROW_THREADS) flash_narrow##SUF##_d##D(const FlashPrefillArgs a) {   \
        flash_prefill_impl<D, 1, 1, LAMINA_FLASH_NARROW_KEYS, KV>(a);                                                          \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(LAMINA_FLASH_NARROW_THREADS) flash_narrow_small##SUF##_d##D(const FlashPrefillArgs a) { \
        flash_prefill_impl<D, 1, 1, LAMINA_FLASH_NARROW_SMALL_KEYS, KV>(a);                                                    \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(LAMINA_FLASH_NARROW_THREADS) flash_narrow_tiny##SUF##_d##D(const FlashPrefillArgs a) { \
        flash_prefill_impl<D, 1, 1, LAMINA_FLASH_NARROW_TINY_KEYS, KV>(a);                                                     \
    }
FLASH_WIDE(64, , bf16)
FLASH_WIDE(128, , bf16)
FLASH_WIDE(64, _fp8, uint8_t)
FLASH_WIDE(128, _fp8, uint8_t)
FLASH_NARROW(64, , bf16)
FLASH_NARROW(128, , bf16)
FLASH_NARROW(256, , bf16)
FLASH_NARROW(64, _fp8, uint8_t)
FLASH_NARROW(128, _fp8, uint8_t)
FLASH_NARROW(256, _fp8, uint8_t)

// ---------------------------------------------------------------------------
// Hopper tiling (flash_hopper_dD, sm_90a only): the same contract, grid and
// row packing as the wide tiling, with the two matrix products on warpgroup
// MMAs. LAMINA_FLASH_HOPPER_THREADS / 128 warpgroups of 128 threads each own 64 query rows; S = Q Kᵀ
// reads Q and K straight from shared memory (K-major descriptors), O += P V
// takes P from registers (the m16n8k16 A layout, as mma.sync) and V from
// shared memory through a transposed (MN-major) descriptor, so neither
// product issues ldmatrix. Tiles use the 128-byte swizzle the descriptors
// describe (wgmma.cuh), in 64-column panels, from a 1024-byte aligned base
// (1 KiB of slack in the dynamic shared memory). K/V tiles are gathered
// through the block table with cp.async, double-buffered as in the wide
// tiling; a proxy fence orders those writes before the wgmma reads.
// Shared memory: (BM + 4 BN) * D bf16 + 1 KiB (49 KiB at D = 64, 193 KiB at 256:
// Hopper's 227 KiB holds it; the launcher leaves an entry out where the
// device's per-block limit does not).
static_assert(64 * (LAMINA_FLASH_HOPPER_THREADS / 128) == LAMINA_FLASH_HOPPER_ROWS,
              "Hopper flash tiling: 64 rows per warpgroup of 128 threads");

// Byte offset of 16-byte chunk `c` of row `r` in a 128B-swizzled tile of R
// rows stored as 64-column panels of R * 128 bytes.
template <int R>
__device__ __forceinline__ uint32_t fh_off(uint32_t r, uint32_t c) {
    return (c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

#if defined(LAMINA_WGMMA)
// The accumulators as [n / 8][4] (the layout the softmax and the epilogue
// index), handed to the wgmma wrappers as the flat [n / 2] they bind.
template <int BN>
__device__ __forceinline__ void fh_scores(float (&d)[BN / 8][4], uint64_t da, uint64_t db, uint32_t acc);
template <>
__device__ __forceinline__ void fh_scores<64>(float (&d)[8][4], uint64_t da, uint64_t db, uint32_t acc) {
    wg_ss_n64(reinterpret_cast<float(&)[32]>(d), da, db, acc);
}
template <>
__device__ __forceinline__ void fh_scores<128>(float (&d)[16][4], uint64_t da, uint64_t db, uint32_t acc) {
    wg_ss_n128(reinterpret_cast<float(&)[64]>(d), da, db, acc);
}
// O += P V for keys 16 kc .. 16 kc + 15 of the V tile at shared address v
// (two 8-row groups 1024 bytes apart; 64-column panels `panel` bytes apart).
template <int D>
__device__ __forceinline__ void fh_pv(float (&d)[D / 8][4], const uint32_t (&a)[4], uint32_t v, uint32_t panel);
template <>
__device__ __forceinline__ void fh_pv<64>(float (&d)[8][4], const uint32_t (&a)[4], uint32_t v, uint32_t panel) {
    wg_rs_n64_t(reinterpret_cast<float(&)[32]>(d), a, wg_desc(v, panel, 1024));
}
template <>
__device__ __forceinline__ void fh_pv<128>(float (&d)[16][4], const uint32_t (&a)[4], uint32_t v, uint32_t panel) {
    wg_rs_n128_t(reinterpret_cast<float(&)[64]>(d), a, wg_desc(v, panel, 1024));
}
// D = 256: two n128 products, over panels 0-1 and 2-3
template <>
__device__ __forceinline__ void fh_pv<256>(float (&d)[32][4], const uint32_t (&a)[4], uint32_t v, uint32_t panel) {
    wg_rs_n128_t(reinterpret_cast<float(&)[64]>(d[0]), a, wg_desc(v, panel, 1024));
    wg_rs_n128_t(reinterpret_cast<float(&)[64]>(d[16]), a, wg_desc(v + 2 * panel, panel, 1024));
}
#endif

template <int D, int WGS, int BN, typename KV>
__device__ __forceinline__ void flash_hopper_impl(const FlashPrefillArgs& a) {
#if defined(LAMINA_WGMMA)
    constexpr int BM = 64 * WGS, THREADS = 128 * WGS, CH = D / 8;
    static_assert(D % 64 == 0, "head dim: whole 64-column panels");
    constexpr bool FP8 = sizeof(KV) == 1;
    constexpr int KB = FP8 ? 1 : 2;  // bf16 K/V buffers
    const uint32_t base = (smem_addr(fp_smem) + (LAMINA_FLASH_HOPPER_ALIGN - 1u)) & ~(LAMINA_FLASH_HOPPER_ALIGN - 1u);
    const uint32_t Qs = base;                          // [D / 64][BM][64]
    const uint32_t Ks = Qs + BM * D * 2;               // [KB][D / 64][BN][64]
    const uint32_t Vs = Ks + KB * BN * D * 2;          // [KB][D / 64][BN][64]
    const uint32_t Kr = Vs + KB * BN * D * 2, Vr = Kr + 2 * BN * D;  // FP8 only: [2][BN][D] bytes each
    const float scale_log2 = FP8 ? a.scale_log2 * a.k_scale : a.scale_log2;
    const float out_scale = FP8 ? a.v_scale : 1.f;

    const uint32_t G = a.num_heads / a.num_kv_heads;
    const uint32_t kvh = blockIdx.x, s = blockIdx.y;
    const uint32_t seq0 = a.cu_seqlens[s], len = a.cu_seqlens[s + 1] - seq0;
    const uint32_t tok0 = (gridDim.z - 1 - blockIdx.z) * a.tok_per_tile;
    if (tok0 >= len || len < a.min_len || len > a.max_len) return;  // uniform over the CTA
    const uint32_t first_pos = a.context_lens[s] - len;
    const uint32_t ntok = min(a.tok_per_tile, len - tok0);
    const uint32_t rows = ntok * G;
    const uint32_t min_pos = first_pos + tok0;
    const uint32_t kend = min_pos + ntok;
    const uint32_t ntiles = (kend + BN - 1) / BN;
    const uint32_t klo = window_first(min_pos, a.window), n0 = klo / BN;  // as the wide tiling
    const uint32_t max_lo = window_first(kend - 1, a.window);
    const size_t row_stride = (size_t)(a.num_heads + 2 * a.num_kv_heads) * D;
    const uint32_t* table = a.block_tables + (size_t)s * a.max_blocks;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;

    for (uint32_t i = tid; i < BM * CH; i += THREADS) {
        const uint32_t r = i / CH, c = i % CH;
        const bool valid = r < rows;
        const uint32_t t = valid ? r / G : 0, g = valid ? r % G : 0;
        const bf16* src = a.qkv + (size_t)(seq0 + tok0 + t) * row_stride + (size_t)(kvh * G + g) * D + c * 8;
        cp16(Qs + fh_off<BM>(r, c), src, valid);
    }
    const uint32_t bs = a.block_size;
    const bool pow2 = (bs & (bs - 1)) == 0;
    const uint32_t bshift = __ffs(bs) - 1;
    auto load_kv = [&](uint32_t kt, uint32_t buf) {
        if constexpr (FP8) {
            fp8_load_raw<D, BN, THREADS>(a, table, kvh, kt, klo, kend, Kr + buf * BN * D, Vr + buf * BN * D, tid);
            return;
        }
        const uint32_t kd = Ks + buf * BN * D * 2, vd = Vs + buf * BN * D * 2;
        const bf16* kc = static_cast<const bf16*>(a.k_cache);
        const bf16* vc = static_cast<const bf16*>(a.v_cache);
        static_assert((BN * CH) % THREADS == 0 && THREADS % CH == 0, "whole K/V tile rows per pass");
#pragma unroll
        for (int it = 0; it < BN * CH / THREADS; it++) {
            const uint32_t j = tid / CH + it * (THREADS / CH), c = tid % CH, pos = kt + j;
            const bool valid = pos >= klo && pos < kend;
            const uint32_t blk = pow2 ? pos >> bshift : pos / bs, in = pow2 ? pos & (bs - 1) : pos % bs;
            const size_t slot = valid ? (size_t)table[blk] * bs + in : 0;
            const size_t off = (slot * a.num_kv_heads + kvh) * D + c * 8;
            cp16(kd + fh_off<BN>(j, c), kc + off, valid);
            cp16(vd + fh_off<BN>(j, c), vc + off, valid);
        }
    };
    load_kv(n0 * BN, n0 & 1);
    cp_commit();

    // This thread's accumulator rows: lane / 4 and lane / 4 + 8 of its warp's
    // 16 rows of its warpgroup's 64; padding rows take the last valid row's position.
    const uint32_t wrow = wg * 64 + (warp % 4) * 16;
    uint32_t qpos[2], qlo[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        qpos[i] = min_pos + min(wrow + lane / 4 + 8 * i, rows - 1) / G;
        qlo[i] = window_first(qpos[i], a.window);
    }
    float o[D / 8][4];  // [column block][(row g, 2 cols), (row g + 8, 2 cols)]
#pragma unroll
    for (int j = 0; j < D / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float sc[BN / 8][4];

    for (uint32_t n = n0; n < ntiles; n++) {
        cp_wait_all();
        if constexpr (FP8) {
            __syncthreads();  // tile n's bytes landed; tile n - 1's reads are done
            fp8_widen_tile<D, BN, THREADS>(Kr + (n & 1) * BN * D, Vr + (n & 1) * BN * D, Ks, Vs, tid,
                                           [](uint32_t r, uint32_t c) { return fh_off<BN>(r, c); });
        }
        wg_fence_proxy();
        __syncthreads();  // tile n (and Q) visible to the async proxy; tile n - 1's reads are done
        if (n + 1 < ntiles) load_kv((n + 1) * BN, (n + 1) & 1);
        cp_commit();
        const uint32_t K = Ks + (FP8 ? 0 : n & 1) * BN * D * 2, V = Vs + (FP8 ? 0 : n & 1) * BN * D * 2;

        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint64_t da = wg_desc(Qs + (kk / 4) * BM * 128 + wg * 64 * 128 + (kk % 4) * 32, 16, 1024);
            const uint64_t db = wg_desc(K + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
            fh_scores<BN>(sc, da, db, kk > 0 ? 1u : 0u);
        }
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_reg_fence(sc[j][e]);
        uint32_t pa[BN / 16][4];
        fp_softmax_tile<BN, D / 8>(sc, o, m, l, pa, qpos, qlo, n * BN, min_pos, max_lo, lane, scale_log2);
#pragma unroll
        for (int j = 0; j < D / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_reg_fence(o[j][e]);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) fh_pv<D>(o, pa[kc], V + kc * 16 * 128, BN * 128);
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < D / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_reg_fence(o[j][e]);
    }
    cp_wait_all();

#pragma unroll
    for (int i = 0; i < 2; i++) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const uint32_t r = wrow + lane / 4 + 8 * i;
        if (r >= rows) continue;
        const float inv = out_scale / li;
        const uint32_t t = r / G, g = r % G;
        bf16* dst = a.out + (size_t)(seq0 + tok0 + t) * a.num_heads * D + (size_t)(kvh * G + g) * D + (lane % 4) * 2;
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *reinterpret_cast<__nv_bfloat162*>(dst + j * 8) =
                __floats2bfloat162_rn(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
#else
    __trap();  // launched only on sm_90 devices, whose code is the sm_90a build
#endif
}

#define FLASH_HOPPER(D, SUF, KV)                                                                             \
    extern "C" __global__ void __launch_bounds__(LAMINA_FLASH_HOPPER_THREADS) flash_hopper##SUF##_d##D(const FlashPrefillArgs a) {   \
        flash_hopper_impl<D, LAMINA_FLASH_HOPPER_THREADS / 128, LAMINA_FLASH_HOPPER_KEYS, KV>(a);                          \
    }
FLASH_HOPPER(64, , bf16)
FLASH_HOPPER(128, , bf16)
FLASH_HOPPER(256, , bf16)
FLASH_HOPPER(64, _fp8, uint8_t)
FLASH_HOPPER(128, _fp8, uint8_t)
FLASH_HOPPER(256, _fp8, uint8_t)
