// Prefill attention: causal, flash-style (tiled, online softmax, no T x T
// score matrix), over packed variable-length sequences, GQA-aware, reading
// every key and value from the paged cache (the chunk's own K/V were written
// there by rope_kv_write, earlier positions by earlier steps).
//
// Grid (ceil(max_seqlen / tok_per_block), S, n_kv); block tok_per_block * G
// threads (G = n_heads / n_kv): thread r serves query token tile0 + r / G of
// head kvh * G + r % G, so the G query heads of a KV head share each K/V tile
// load. Query i of sequence s sits at position context_len - seqlen + i and
// attends to cached positions window_first(that position, window)..=that
// position (all of 0..=it without a sliding window); key tiles wholly before
// the block's earliest window are never loaded. q, acc live in registers,
// K/V tiles of BK keys in shared memory as f32; scores use exp2 with the
// layer's score scale (and log2(e)) folded into q. At D = 256 q and acc
// (512 floats a thread) exceed the register file and live partly in local
// memory: correct, slower per key than the flash kernels (which serve it on
// Hopper: the wide mma.sync tiling stops at 128). K/V tiles hold BK = LAMINA_PREFILL_TILE_ELEMS / D keys;
// one kernel per head size of LAMINA_FOR_EACH_HEAD_DIM, each taking the one
// argument struct PrefillAttentionArgs (lamina_args.cuh, from src/abi.rs).
// prefill_attention_fp8_dD reads e4m3 caches (kv.cuh): each element widened
// and multiplied by its layer's k_scale / v_scale as the tile is loaded.
#include "common.cuh"
#include "kv.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

static_assert(2 * LAMINA_PREFILL_TILE_ELEMS * sizeof(float) <= LAMINA_STATIC_SMEM_LIMIT,
              "prefill K/V tiles exceed static shared memory");

// A cache element as f32: bf16 widened, or an e4m3 byte times its scale.
__device__ __forceinline__ float kv_elem(const bf16* c, size_t i, float) { return bf2f(c[i]); }
__device__ __forceinline__ float kv_elem(const uint8_t* c, size_t i, float scale) {
    return kv_fp8x2_to_float2(c[i]).x * scale;
}

template <int D, int BK, typename KV>
__device__ __forceinline__ void prefill_attention_impl(
    const bf16* __restrict__ qkv,              // [T, (n_heads + 2 n_kv) D], q roped
    const KV* __restrict__ k_cache,            // [slots, n_kv, D]
    const KV* __restrict__ v_cache,            // [slots, n_kv, D]
    const uint32_t* __restrict__ cu_seqlens,   // [S + 1]
    const uint32_t* __restrict__ context_lens, // [S]
    const uint32_t* __restrict__ block_tables, // [S, max_blocks]
    bf16* __restrict__ out,                    // [T, n_heads D]
    uint32_t max_blocks, uint32_t n_heads, uint32_t n_kv, uint32_t block_size, uint32_t tok_per_block,
    float scale, float k_scale, float v_scale, uint32_t window) {
    __shared__ float Ks[BK][D];
    __shared__ float Vs[BK][D];
    const uint32_t G = n_heads / n_kv;
    const uint32_t s = blockIdx.y, kvh = blockIdx.z;
    const uint32_t seq0 = cu_seqlens[s], len = cu_seqlens[s + 1] - seq0;
    const uint32_t tile0 = blockIdx.x * tok_per_block;
    if (tile0 >= len) return;  // uniform over the block
    const uint32_t ctx = context_lens[s];
    const uint32_t first_pos = ctx - len;
    const uint32_t tl = threadIdx.x / G, g = threadIdx.x % G;
    const uint32_t ti = tile0 + tl;
    const bool active = tl < tok_per_block && ti < len;
    const uint32_t qpos = first_pos + ti;
    const uint32_t qlo = window_first(qpos, window);  // this row's first key
    const uint32_t head = kvh * G + g;
    const size_t row_stride = (size_t)(n_heads + 2 * n_kv) * D;
    const uint32_t* table = block_tables + (size_t)s * max_blocks;
    const float qscale = scale * 1.4426950408889634f;  // log2(e)

    float q[D], acc[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        q[d] = active ? bf2f(qkv[(seq0 + ti) * row_stride + (size_t)head * D + d]) * qscale : 0.f;
        acc[d] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const uint32_t last = min(len, tile0 + tok_per_block) - 1;
    const uint32_t kend = first_pos + last + 1;
    // the block's first query sees the earliest keys (klo): start at its
    // window's tile; keys before klo are zeros (never scored; a table entry
    // before every window of the step may name a block released to others)
    const uint32_t klo = window_first(first_pos + tile0, window);
    const uint32_t kstart = klo / BK * BK;
    for (uint32_t kt = kstart; kt < kend; kt += BK) {
        const uint32_t nk = min((uint32_t)BK, kend - kt);
        __syncthreads();
        for (uint32_t e = threadIdx.x; e < (uint32_t)(BK * D); e += blockDim.x) {
            uint32_t j = e / D, d = e % D;
            float kv = 0.f, vv = 0.f;
            if (j < nk && kt + j >= klo) {
                size_t off = (kv_slot(table, kt + j, block_size) * n_kv + kvh) * D + d;
                kv = kv_elem(k_cache, off, k_scale);
                vv = kv_elem(v_cache, off, v_scale);
            }
            Ks[j][d] = kv;
            Vs[j][d] = vv;
        }
        __syncthreads();
        if (!active || kt > qpos || kt + nk <= qlo) continue;
        const uint32_t jmax = min(nk, qpos - kt + 1);
        const uint32_t jmin = qlo > kt ? qlo - kt : 0;
        for (uint32_t j0 = jmin; j0 < jmax; j0 += LAMINA_PREFILL_SCORE_STEP) {
            float sc[LAMINA_PREFILL_SCORE_STEP];
            float mt = m;
#pragma unroll
            for (int jj = 0; jj < LAMINA_PREFILL_SCORE_STEP; jj++) {
                float v = -INFINITY;
                if (j0 + jj < jmax) {
                    v = 0.f;
#pragma unroll
                    for (int d = 0; d < D; d++) v += q[d] * Ks[j0 + jj][d];
                }
                sc[jj] = v;
                mt = fmaxf(mt, v);
            }
            const float corr = exp2f(m - mt);
            l *= corr;
#pragma unroll
            for (int d = 0; d < D; d++) acc[d] *= corr;
#pragma unroll
            for (int jj = 0; jj < LAMINA_PREFILL_SCORE_STEP; jj++) {
                if (j0 + jj < jmax) {
                    const float p = exp2f(sc[jj] - mt);
                    l += p;
#pragma unroll
                    for (int d = 0; d < D; d++) acc[d] += p * Vs[j0 + jj][d];
                }
            }
            m = mt;
        }
    }
    if (active) {
        const float inv = 1.f / l;
        bf16* o = out + (seq0 + ti) * (size_t)n_heads * D + (size_t)head * D;
#pragma unroll
        for (int d = 0; d < D; d++) o[d] = f2bf(acc[d] * inv);
    }
}

#define PREFILL_ATTENTION(D)                                                                            \
    extern "C" __global__ void prefill_attention_d##D(const PrefillAttentionArgs a) {                  \
        static_assert(LAMINA_PREFILL_TILE_ELEMS % D == 0, "tile must hold whole keys");                \
        prefill_attention_impl<D, LAMINA_PREFILL_TILE_ELEMS / D>(                                      \
            a.qkv, static_cast<const bf16*>(a.k_cache), static_cast<const bf16*>(a.v_cache),           \
            a.cu_seqlens, a.context_lens, a.block_tables, a.out,                                         \
            a.max_blocks, a.n_heads, a.n_kv, a.block_size, a.tok_per_block, a.scale, 1.f, 1.f, a.window); \
    }                                                                                                   \
    extern "C" __global__ void prefill_attention_fp8_d##D(const PrefillAttentionArgs a) {              \
        prefill_attention_impl<D, LAMINA_PREFILL_TILE_ELEMS / D>(                                      \
            a.qkv, static_cast<const uint8_t*>(a.k_cache), static_cast<const uint8_t*>(a.v_cache),     \
            a.cu_seqlens, a.context_lens, a.block_tables, a.out,                                         \
            a.max_blocks, a.n_heads, a.n_kv, a.block_size, a.tok_per_block, a.scale, a.k_scale,          \
            a.v_scale, a.window);                                                                        \
    }
LAMINA_FOR_EACH_HEAD_DIM(PREFILL_ATTENTION)
#undef PREFILL_ATTENTION
