// Flash prefill attention on tensor cores (FlashAttention-2 structure):
// causal, packed variable-length sequences, GQA, every key and value read
// from the paged cache (the chunk's own K/V were written there first).
//
// Grid (ceil(max_seqlen / tok_per_tile), S, n_kv), FP_THREADS threads
// (FP_WARPS warps). A CTA serves tok_per_tile query tokens x the G = n_heads /
// n_kv query heads of one KV head, packed into FP_BM = 16 * FP_WARPS rows
// (row r = token r / G, head r % G), so each K/V tile load serves all G heads;
// warp w owns rows 16w..16w+15. Query i of sequence s sits at position
// context_len - seqlen + i and attends to positions 0..=that.
// Per 64-key tile (FP_BN): K and V are gathered through the block table with
// 16-byte cp.async copies into XOR-swizzled shared memory (double-buffered:
// tile n+1 loads while tile n computes), S = Q Kᵀ and O += P V run on
// mma.sync m16n8k16 bf16 (f32 accumulate) with ldmatrix operands (.trans for
// V), the online softmax stays in registers (exp2, scale folded in), the
// causal mask is applied only on tiles that reach past the CTA's first query
// position, and tiles past its last one are never loaded. Keys past the end
// are zero-filled, padding rows (past the sequence, or past tok_per_tile * G)
// are computed on zero queries and never stored. Tiles are visited heaviest
// first (blockIdx.x reversed). Deterministic: no atomics, fixed order.
// Shared memory: (FP_BM + 4 FP_BN) * D bf16 (48 KiB at D = 64, 96 at 128).
#include <stddef.h>

#include "common.cuh"

struct FlashPrefillArgs {
    const bf16* qkv;              // [T, (n_heads + 2 n_kv) D], q roped
    const bf16* k_cache;          // [slots, n_kv, D]
    const bf16* v_cache;          // [slots, n_kv, D]
    const uint32_t* cu_seqlens;   // [S + 1]
    const uint32_t* context_lens; // [S]
    const uint32_t* block_tables; // [S, max_blocks]
    bf16* out;                    // [T, n_heads D]
    uint32_t max_blocks;
    uint32_t num_heads;
    uint32_t num_kv_heads;
    uint32_t block_size;
    uint32_t tok_per_tile;  // query tokens per CTA; tok_per_tile * G <= FP_BM
    float scale_log2;       // log2(e) / sqrt(D)
};
static_assert(sizeof(FlashPrefillArgs) == 80, "FlashPrefillArgs layout");
static_assert(offsetof(FlashPrefillArgs, qkv) == 0, "qkv");
static_assert(offsetof(FlashPrefillArgs, k_cache) == 8, "k_cache");
static_assert(offsetof(FlashPrefillArgs, v_cache) == 16, "v_cache");
static_assert(offsetof(FlashPrefillArgs, cu_seqlens) == 24, "cu_seqlens");
static_assert(offsetof(FlashPrefillArgs, context_lens) == 32, "context_lens");
static_assert(offsetof(FlashPrefillArgs, block_tables) == 40, "block_tables");
static_assert(offsetof(FlashPrefillArgs, out) == 48, "out");
static_assert(offsetof(FlashPrefillArgs, max_blocks) == 56, "max_blocks");
static_assert(offsetof(FlashPrefillArgs, num_heads) == 60, "num_heads");
static_assert(offsetof(FlashPrefillArgs, num_kv_heads) == 64, "num_kv_heads");
static_assert(offsetof(FlashPrefillArgs, block_size) == 68, "block_size");
static_assert(offsetof(FlashPrefillArgs, tok_per_tile) == 72, "tok_per_tile");
static_assert(offsetof(FlashPrefillArgs, scale_log2) == 76, "scale_log2");

#define FP_WARPS 8
#define FP_THREADS (32 * FP_WARPS)
#define FP_BM (16 * FP_WARPS)
#define FP_BN 64

extern __shared__ uint4 fp_smem[];

__device__ __forceinline__ uint32_t fp_saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy; zero-fills the destination when !valid.
__device__ __forceinline__ void fp_cp16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void fp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

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

template <int D>
__device__ __forceinline__ void flash_prefill_impl(const FlashPrefillArgs& a) {
    static_assert(D % 16 == 0 && D >= 64, "head dim: multiple of 16, at least 64 (8 chunks for the swizzle)");
    constexpr int CH = D / 8;  // 16-byte chunks per row
    bf16* Qs = reinterpret_cast<bf16*>(fp_smem);  // [FP_BM][D]
    bf16* Ks = Qs + FP_BM * D;                    // [2][FP_BN][D]
    bf16* Vs = Ks + 2 * FP_BN * D;                // [2][FP_BN][D]

    const uint32_t G = a.num_heads / a.num_kv_heads;
    const uint32_t s = blockIdx.y, kvh = blockIdx.z;
    const uint32_t seq0 = a.cu_seqlens[s], len = a.cu_seqlens[s + 1] - seq0;
    const uint32_t tok0 = (gridDim.x - 1 - blockIdx.x) * a.tok_per_tile;
    if (tok0 >= len) return;  // uniform over the CTA
    const uint32_t first_pos = a.context_lens[s] - len;
    const uint32_t ntok = min(a.tok_per_tile, len - tok0);
    const uint32_t rows = ntok * G;
    const uint32_t min_pos = first_pos + tok0;  // first query's position
    const uint32_t kend = min_pos + ntok;       // keys 0..kend are needed
    const uint32_t ntiles = (kend + FP_BN - 1) / FP_BN;
    const size_t row_stride = (size_t)(a.num_heads + 2 * a.num_kv_heads) * D;
    const uint32_t* table = a.block_tables + (size_t)s * a.max_blocks;
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    for (uint32_t i = tid; i < FP_BM * CH; i += FP_THREADS) {
        const uint32_t r = i / CH, c = i % CH;
        const bool valid = r < rows;
        const uint32_t t = valid ? r / G : 0, g = valid ? r % G : 0;
        const bf16* src = a.qkv + (size_t)(seq0 + tok0 + t) * row_stride + (size_t)(kvh * G + g) * D + c * 8;
        fp_cp16(fp_saddr(Qs + fp_swz<D>(r, c)), src, valid);
    }
    auto load_kv = [&](uint32_t kt, uint32_t buf) {
        bf16* kd = Ks + buf * FP_BN * D;
        bf16* vd = Vs + buf * FP_BN * D;
        for (uint32_t i = tid; i < FP_BN * CH; i += FP_THREADS) {
            const uint32_t j = i / CH, c = i % CH, pos = kt + j;
            const bool valid = pos < kend;
            const size_t off =
                valid ? (kv_slot(table, pos, a.block_size) * a.num_kv_heads + kvh) * D + c * 8 : 0;
            fp_cp16(fp_saddr(kd + fp_swz<D>(j, c)), a.k_cache + off, valid);
            fp_cp16(fp_saddr(vd + fp_swz<D>(j, c)), a.v_cache + off, valid);
        }
    };
    load_kv(0, 0);
    fp_commit();

    // This thread's two rows (fragment rows lane / 4 and lane / 4 + 8) and
    // their positions; padding rows take the last valid row's position.
    uint32_t qpos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t r = min(warp * 16 + lane / 4 + 8 * i, rows - 1);
        qpos[i] = min_pos + r / G;
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    uint32_t qf[D / 16][4];

    for (uint32_t n = 0; n < ntiles; n++) {
        fp_wait_all();
        __syncthreads();  // tile n (and Q) visible; every warp is done with tile n - 1
        if (n == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                fp_ldsm(qf[kk], fp_saddr(Qs + fp_swz<D>(warp * 16 + lane % 16, kk * 2 + lane / 16)));
        }
        if (n + 1 < ntiles) load_kv((n + 1) * FP_BN, (n + 1) & 1);
        fp_commit();
        const bf16* K = Ks + (n & 1) * FP_BN * D;
        const bf16* V = Vs + (n & 1) * FP_BN * D;

        float sc[FP_BN / 8][4];
#pragma unroll
        for (int j = 0; j < FP_BN / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int nb = 0; nb < FP_BN / 16; nb++) {
                uint32_t b[4];
                fp_ldsm(b, fp_saddr(K + fp_swz<D>(nb * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2)));
                fp_mma(sc[2 * nb], qf[kk], b[0], b[1]);
                fp_mma(sc[2 * nb + 1], qf[kk], b[2], b[3]);
            }
        }

        const uint32_t kt = n * FP_BN;
        const bool masked = kt + FP_BN - 1 > min_pos;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < FP_BN / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sc[j][e] * a.scale_log2;
                if (masked && kt + j * 8 + (lane % 4) * 2 + (e & 1) > qpos[e >> 1]) v = -INFINITY;
                sc[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float corr[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            corr[i] = exp2f(m[i] - mx[i]);  // 0 on the first tile (m = -inf, mx finite: key 0 is never masked)
            m[i] = mx[i];
        }
#pragma unroll
        for (int j = 0; j < FP_BN / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(sc[j][e] - m[e >> 1]);
                sc[j][e] = p;
                rs[e >> 1] += p;
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) l[i] = l[i] * corr[i] + rs[i];
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }

#pragma unroll
        for (int kc = 0; kc < FP_BN / 16; kc++) {
            const uint32_t pa[4] = {fp_pack(sc[2 * kc][0], sc[2 * kc][1]), fp_pack(sc[2 * kc][2], sc[2 * kc][3]),
                                    fp_pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]),
                                    fp_pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
            for (int db = 0; db < D / 16; db++) {
                uint32_t b[4];
                fp_ldsm_t(b, fp_saddr(V + fp_swz<D>(kc * 16 + ((lane / 8) % 2) * 8 + lane % 8, db * 2 + lane / 16)));
                fp_mma(o[2 * db], pa, b[0], b[1]);
                fp_mma(o[2 * db + 1], pa, b[2], b[3]);
            }
        }
    }
    fp_wait_all();

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const uint32_t r = warp * 16 + lane / 4 + 8 * i;
        if (r >= rows) continue;
        const float inv = 1.f / l[i];
        const uint32_t t = r / G, g = r % G;
        bf16* dst = a.out + (size_t)(seq0 + tok0 + t) * a.num_heads * D + (size_t)(kvh * G + g) * D + (lane % 4) * 2;
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *reinterpret_cast<__nv_bfloat162*>(dst + j * 8) =
                __floats2bfloat162_rn(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    }
}

#define FLASH_PREFILL(D)                                                                       \
    extern "C" __global__ void __launch_bounds__(FP_THREADS) flash_prefill_d##D(const FlashPrefillArgs a) { \
        flash_prefill_impl<D>(a);                                                              \
    }
FLASH_PREFILL(64)
FLASH_PREFILL(128)
