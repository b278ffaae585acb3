// Batch-invariant GEMM: y[m, n] = x[m, k] · w[n, k]ᵀ (bf16 in, fp32
// accumulation, bf16 or f32 out) where every output's reduction over k is
// the same sequence of operations whatever m is and wherever its row sits:
// one kernel for one row and for thousands, memory-bound like a GEMV at one
// row and on tensor cores at many.
//
// Layout: a block is `slices` warps (slices(k) on the Rust side: the count
// follows k alone) over LAMINA_INV_GEMM_FEATURES weight rows and
// LAMINA_INV_GEMM_ROW_TILES tiles of 8 input rows; warp s reduces the s-th
// contiguous slice of k's LAMINA_INV_GEMM_K_CHUNK-column chunks, in order,
// with mma.sync m16n8k16 (weights as A, the 16 x 16 tile; input rows as B,
// 8 columns). Each lane loads 16 bytes of weight rows g and g+8 and 16
// bytes of input row g per chunk (g = lane / 4, q = lane % 4, columns
// 8q..8q+7 of the chunk): the first product takes columns 8q..8q+3 of every
// lane, the second 8q+4..8q+7, the same permutation of k for A and B, so
// the pair computes the chunk's dot products exactly once. The slices'
// partial sums meet in shared memory and are added in slice order. An
// output's value therefore depends on its weight row, its input row and k
// alone: the m16n8k16 product of one element reads only that element's A
// row and B column, rows past m are zeros that no kept output reads, and
// neither the block's other rows nor the grid shape enter any sum.
//
// Weights are read before the programmatic-dependent-launch wait (they are
// never written by a step); inputs after it. Grid: x over tiles of
// 8 * ROW_TILES input rows (fastest, so blocks sharing a weight tile run
// together and re-read it from L2), y over weight-row tiles.
//
// The tiled form (invariant_gemm_tiled_*, for many rows) computes the same
// bits with the operands staged in shared memory: a block of 8 warps over
// TILE_FEATURES weight rows and TILE_ROWS input rows, each warp 32 x 32
// outputs, k in chunks through STAGES cp.async stages. Every output sees
// the same operations as in the direct form: each lane reads the same 16
// bytes of a weight row and an input row per chunk (now from shared
// memory), the same two m16n8k16 products per chunk accumulate from zero
// over the chunks of one slice, and the slices' sums are added in slice
// order (the first slice's sum taken as is, then each next one added).
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "cp_async.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

namespace {

constexpr int KC = LAMINA_INV_GEMM_K_CHUNK;
constexpr int RT = LAMINA_INV_GEMM_ROW_TILES;
constexpr int U = LAMINA_INV_GEMM_UNROLL;
constexpr int S_MAX = LAMINA_INV_GEMM_MAX_SLICES;
static_assert(KC == 32, "a chunk is two m16n8k16 products over 8 columns a lane");
static_assert(LAMINA_INV_GEMM_FEATURES == 16, "one m16 tile of weight rows a block");

__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void store(bf16* y, size_t i, float v) { y[i] = f2bf(v); }
__device__ __forceinline__ void store(float* y, size_t i, float v) { y[i] = v; }

// Weight chunks c0.. c0+U-1 of rows `wa` and `wb` (chunks at or past `end`
// are left alone).
__device__ __forceinline__ void load_weights(uint4* pa, uint4* pb, const bf16* wa, const bf16* wb,
                                             uint32_t c0, uint32_t end) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (c0 + u < end) {
            pa[u] = ld_before_wait(wa + (size_t)(c0 + u) * KC);
            pb[u] = ld_before_wait(wb + (size_t)(c0 + u) * KC);
        }
    }
}

template <typename OutT>
__device__ void invariant_gemm(const InvariantGemmArgs& a) {
    __shared__ float part[S_MAX][RT][32][4];
    const uint32_t lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, q = lane & 3;
    const uint32_t f0 = blockIdx.y * 16, r0 = blockIdx.x * 8 * RT;
    const uint32_t per = a.k / KC / a.slices;
    const uint32_t begin = s * per, end = begin + per;
    // rows past n load row n - 1: their outputs are never stored
    const bf16* wa = a.w + (size_t)min(f0 + g, a.n - 1) * a.k + 8 * q;
    const bf16* wb = a.w + (size_t)min(f0 + g + 8, a.n - 1) * a.k + 8 * q;
    const int tiles = (int)min((uint32_t)RT, (a.m - r0 + 7) / 8);

    float acc[RT][4];
#pragma unroll
    for (int j = 0; j < RT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    uint4 pa[U], pb[U], na[U], nb[U];
    load_weights(pa, pb, wa, wb, begin, end);
    pdl_wait();
    for (uint32_t c = begin; c < end; c += U) {
        load_weights(na, nb, wa, wb, c + U, end);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u >= end) break;
#pragma unroll
            for (int j = 0; j < RT; j++) {
                if (j >= tiles) break;
                const uint32_t row = r0 + 8 * j + g;
                uint4 xv = make_uint4(0, 0, 0, 0);
                if (row < a.m) {
                    xv = *reinterpret_cast<const uint4*>(a.x + (size_t)row * a.k +
                                                         (size_t)(c + u) * KC + 8 * q);
                }
                mma16816(acc[j], pa[u].x, pb[u].x, pa[u].y, pb[u].y, xv.x, xv.y);
                mma16816(acc[j], pa[u].z, pb[u].z, pa[u].w, pb[u].w, xv.z, xv.w);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            pa[u] = na[u];
            pb[u] = nb[u];
        }
    }
    pdl_launch_dependents();
#pragma unroll
    for (int j = 0; j < RT; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) part[s][j][lane][e] = acc[j][e];
    }
    __syncthreads();
    // accumulator element e of lane L, tile j: weight row g + 8 (e / 2),
    // input row 8 j + 2 q + e % 2
    OutT* y = static_cast<OutT*>(a.y);
    for (uint32_t i = threadIdx.x; i < RT * 32 * 4; i += blockDim.x) {
        const uint32_t j = i / 128, l = (i / 4) % 32, e = i % 4;
        const uint32_t f = f0 + (l >> 2) + 8 * (e >> 1);
        const uint32_t row = r0 + 8 * j + 2 * (l & 3) + (e & 1);
        if (f >= a.n || row >= a.m) continue;
        float v = part[0][j][l][e];
        for (uint32_t t = 1; t < a.slices; t++) v += part[t][j][l][e];
        store(y, (size_t)row * a.n + f, v);
    }
}

constexpr int TF = LAMINA_INV_GEMM_TILE_FEATURES;
constexpr int TR = LAMINA_INV_GEMM_TILE_ROWS;
constexpr int STAGES = LAMINA_INV_GEMM_STAGES;
static_assert(TF == 64 && TR == 128, "8 warps of 32 weight rows x 32 input rows");

// Chunk c of the block's weight rows (one 16-byte part a thread) and input
// rows (two) into stage `st`; rows past n repeat row n - 1 (never stored),
// rows past m are zeros.
__device__ __forceinline__ void tiled_load(uint4 (*sw)[4], uint4 (*sx)[4], const InvariantGemmArgs& a,
                                           uint32_t f0, uint32_t r0, uint32_t c) {
    const uint32_t t = threadIdx.x;
    {
        const uint32_t row = t >> 2, part = t & 3;
        const bf16* src = a.w + (size_t)min(f0 + row, a.n - 1) * a.k + (size_t)c * KC + 8 * part;
        cp16(smem_addr(&sw[row][part]), src, true);
    }
#pragma unroll
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t idx = t + 256 * i, row = idx >> 2, part = idx & 3;
        const bool valid = r0 + row < a.m;
        const bf16* src = a.x + (size_t)(valid ? r0 + row : 0) * a.k + (size_t)c * KC + 8 * part;
        cp16(smem_addr(&sx[row][part]), src, valid);
    }
}

template <typename OutT>
__device__ void invariant_gemm_tiled(const InvariantGemmArgs& a) {
    __shared__ uint4 sw[STAGES][TF][4];  // [stage][weight row][16-byte part of the chunk]
    __shared__ uint4 sx[STAGES][TR][4];  // [stage][input row][16-byte part of the chunk]
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, q = lane & 3;
    const uint32_t f0 = blockIdx.y * TF, r0 = blockIdx.x * TR;
    const uint32_t wf = (warp & 1) * 32, wr = (warp >> 1) * 32;
    const uint32_t chunks = a.k / KC, per = chunks / a.slices;

    // accumulators of weight tile i (2), input tile j (4), element e (4)
    // at [(4 i + j) * 4 + e]: this slice's (acc) and the slices' so far (tot)
    constexpr int NACC = 2 * 4 * 4;
    float acc[NACC], tot[NACC];
#pragma unroll
    for (int t = 0; t < NACC; t++) acc[t] = tot[t] = 0.f;
    pdl_wait();
#pragma unroll
    for (uint32_t st = 0; st < STAGES - 1; st++) {
        if (st < chunks) tiled_load(sw[st], sx[st], a, f0, r0, st);
        cp_commit();
    }
    for (uint32_t c = 0; c < chunks; c++) {
        cp_wait<STAGES - 2>();
        __syncthreads();
        // the stage read at c - 1, free once every warp passed the barrier
        const uint32_t next = c + STAGES - 1;
        if (next < chunks) tiled_load(sw[next % STAGES], sx[next % STAGES], a, f0, r0, next);
        cp_commit();
        const uint32_t st = c % STAGES;
        uint4 pa[2], pb[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            pa[i] = sw[st][wf + 16 * i + g][q];
            pb[i] = sw[st][wf + 16 * i + g + 8][q];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint4 xv = sx[st][wr + 8 * j + g][q];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float* c4 = &acc[(4 * i + j) * 4];
                mma16816(c4, pa[i].x, pb[i].x, pa[i].y, pb[i].y, xv.x, xv.y);
                mma16816(c4, pa[i].z, pb[i].z, pa[i].w, pb[i].w, xv.z, xv.w);
            }
        }
        if ((c + 1) % per == 0) {
            const bool first = c + 1 == per;
#pragma unroll
            for (int t = 0; t < NACC; t++) {
                tot[t] = first ? acc[t] : tot[t] + acc[t];
                acc[t] = 0.f;
            }
        }
    }
    cp_wait_all();
    pdl_launch_dependents();
    // accumulator element e of lane (g, q), tiles i and j: weight row
    // wf + 16 i + g + 8 (e / 2), input row wr + 8 j + 2 q + e % 2
    OutT* y = static_cast<OutT*>(a.y);
#pragma unroll
    for (int t = 0; t < NACC; t++) {
        const int i = t / 16, j = (t / 4) % 4, e = t % 4;
        const uint32_t f = f0 + wf + 16 * i + g + 8 * (e >> 1);
        const uint32_t row = r0 + wr + 8 * j + 2 * q + (e & 1);
        if (f < a.n && row < a.m) store(y, (size_t)row * a.n + f, tot[t]);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(32 * S_MAX)
    invariant_gemm_bf16(const InvariantGemmArgs a) {
    invariant_gemm<bf16>(a);
}

extern "C" __global__ void __launch_bounds__(32 * S_MAX)
    invariant_gemm_f32(const InvariantGemmArgs a) {
    invariant_gemm<float>(a);
}

extern "C" __global__ void __launch_bounds__(256) invariant_gemm_tiled_bf16(const InvariantGemmArgs a) {
    invariant_gemm_tiled<bf16>(a);
}

extern "C" __global__ void __launch_bounds__(256) invariant_gemm_tiled_f32(const InvariantGemmArgs a) {
    invariant_gemm_tiled<float>(a);
}
