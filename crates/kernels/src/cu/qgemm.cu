// Block-format GEMM for the GEMM path's small and middle batches:
// y[m, n] = x[m, k] · W[n, k]ᵀ with W in a block format of
// cu/gemv_formats.cuh (GGUF blocks, int4) widened in registers, never
// copied to a bf16 matrix; bf16 x and y, fp32 accumulation on tensor cores
// (mma.sync m16n8k16). The widened weights are the format type's values
// rounded to bf16: what gguf_dequant (cu/gguf.cu) writes for cuBLAS.
//
// Block: LAMINA_QGEMM_WARPS warps; warp w owns one m16 tile of weight rows
// (f0 + 16 w ..) and the block's LAMINA_QGEMM_ROWS input rows (eight n8
// tiles, those past m skipped). k goes in steps of LAMINA_QGEMM_K_STEP
// columns: lane (g, q) holds columns 32 q .. 32 q + 31 of the step of
// weight rows g and g + 8 of its tile (32 / COLS chunks each, with their
// side records), loaded two steps ahead into registers (the first two
// before the PDL wait: weights are never written by a step), widens them
// to bf16 pairs, and runs eight products per n8 tile, product s taking the
// lane's columns 4 s .. 4 s + 3 as its k positions {2q, 2q+1, 2q+8, 2q+9}
// of both operands: the same permutation of k for W and x, so each product
// pairs equal columns. An output's sum is its k steps in order, each the
// products in order: it depends on its weight row, its input row and k
// alone (not on m or the row's place in the tile).
// The input rows' columns of a step (ROWS x 128 bf16) are staged in
// dynamic shared memory through LAMINA_QGEMM_STAGES cp.async stages shared
// by the block's warps, each row's 16-byte unit 4q + t stored at slot
// 4t + q of a row of LAMINA_QGEMM_ROW_UNITS units, so that the lanes of a
// shared-memory phase read distinct banks.
// Grid: x over tiles of ROWS input rows (fastest: blocks sharing weight
// rows run together and re-read them from L2), y over tiles of 16 * WARPS
// weight rows. Requires k a multiple of 32 and of the format's group and
// 16-byte aligned operands; a lane's chunk past k is zeros, weight rows
// past n repeat row n - 1 (never stored), input rows past m are zeros.
// One entry per block format, qgemm_<format> (the prefix of
// `gemv::WeightFormat` without its `gemv_`).
#include "common.cuh"
#include "cp_async.cuh"
#include "gemv_formats.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

namespace {

constexpr int QW = LAMINA_QGEMM_WARPS;
constexpr int QR = LAMINA_QGEMM_ROWS;
constexpr int QK = LAMINA_QGEMM_K_STEP;
constexpr int QS = LAMINA_QGEMM_STAGES;
constexpr int QU = LAMINA_QGEMM_ROW_UNITS;
static_assert(QK == 128, "four lanes of 32 columns a step");
static_assert(QU >= QK / 8, "a staged row holds the step's 16-byte units");
static_assert(QR == 64, "eight n8 tiles a block");

__device__ __forceinline__ void qmma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A lane's weights of one step: NCH chunks of rows g and g + 8 and their records.
template <class F>
struct QStep {
    static constexpr int NCH = 32 / F::COLS;
    uint4 w0[NCH], w1[NCH];
    typename F::Side s0[NCH], s1[NCH];
};

// The lane's chunks of step `c` (columns kk = c * 128 + 32 q ..), zeros when kk >= k.
template <class F>
__device__ __forceinline__ void qload(QStep<F>& st, const unsigned char* w0, const unsigned char* w1,
                                      const unsigned char* s0, const unsigned char* s1, uint32_t kk, uint32_t k) {
    const uint4 z = make_uint4(0, 0, 0, 0);
    const bool in = kk < k;
#pragma unroll
    for (int ch = 0; ch < QStep<F>::NCH; ch++) {
        const uint32_t col = kk + ch * F::COLS;
        const size_t chunk = (size_t)(col / F::COLS) * 16, rec = (size_t)(col / F::GROUP) * F::SIDE;
        st.w0[ch] = in ? ld_before_wait(w0 + chunk) : z;
        st.w1[ch] = in ? ld_before_wait(w1 + chunk) : z;
        st.s0[ch] = in ? F::side(s0 + rec, col) : typename F::Side{};
        st.s1[ch] = in ? F::side(s1 + rec, col) : typename F::Side{};
    }
}

__device__ __forceinline__ uint32_t bf2_bits(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// The lane's 32 weights of each row as 16 bf16 pairs (zeros past k).
template <class F>
__device__ __forceinline__ void qwiden(const QStep<F>& st, uint32_t kk, uint32_t k, uint32_t* a0, uint32_t* a1) {
    float f0[32], f1[32];
#pragma unroll
    for (int ch = 0; ch < QStep<F>::NCH; ch++) {
        F::widen(st.w0[ch], st.s0[ch], kk + ch * F::COLS, f0 + ch * F::COLS);
        F::widen(st.w1[ch], st.s1[ch], kk + ch * F::COLS, f1 + ch * F::COLS);
    }
    const bool in = kk < k;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        a0[i] = in ? bf2_bits(f0[2 * i], f0[2 * i + 1]) : 0u;
        a1[i] = in ? bf2_bits(f1[2 * i], f1[2 * i + 1]) : 0u;
    }
}

// Stage `buf` <- the input rows' columns of step `c` (unit 4q + t of a row
// to slot 4t + q; rows past m and columns past k zero-filled).
__device__ __forceinline__ void qstage(uint4* buf, const QgemmArgs& a, uint32_t r0, uint32_t c) {
    constexpr int UNITS = QK / 8;
    for (uint32_t i = threadIdx.x; i < QR * UNITS; i += QW * 32) {
        const uint32_t row = i / UNITS, u = i % UNITS;
        const uint32_t col = c * QK + u * 8;
        const bool valid = r0 + row < a.m && col < a.k;
        const bf16* src = a.x + (size_t)(valid ? r0 + row : 0) * a.k + (valid ? col : 0);
        cp16(smem_addr(buf + row * QU + (u % 4) * 4 + u / 4), src, valid);
    }
}

// One step: widen the lane's weights of step c (slot st), load step c + 2
// into it, then the products of the staged inputs.
template <class F>
__device__ __forceinline__ void qstep(QStep<F>& st, const uint4* xs, float (*acc)[4], int tiles, uint32_t c,
                                      uint32_t steps, uint32_t q, uint32_t g, const unsigned char* w0,
                                      const unsigned char* w1, const unsigned char* s0, const unsigned char* s1,
                                      uint32_t k) {
    uint32_t a0[16], a1[16];
    const uint32_t kk = c * QK + 32 * q;
    qwiden<F>(st, kk, k, a0, a1);
    if (c + 2 < steps) qload<F>(st, w0, w1, s0, s1, kk + 2 * QK, k);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j >= tiles) break;
        const uint4* row = xs + (8 * j + g) * QU + q;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const uint4 v = row[4 * t];
            qmma(acc[j], a0[4 * t], a1[4 * t], a0[4 * t + 1], a1[4 * t + 1], v.x, v.y);
            qmma(acc[j], a0[4 * t + 2], a1[4 * t + 2], a0[4 * t + 3], a1[4 * t + 3], v.z, v.w);
        }
    }
}

template <class F>
__device__ void qgemm(const QgemmArgs& a) {
    extern __shared__ __align__(16) uint4 qgemm_xs[];  // [QS][QR][QU] 16-byte units
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t g = lane >> 2, q = lane & 3;
    const uint32_t r0 = blockIdx.x * QR, f0 = blockIdx.y * (16 * QW) + 16 * warp;
    const uint32_t steps = (a.k + QK - 1) / QK;
    const int tiles = (int)min(8u, (a.m - r0 + 7) / 8);
    const size_t row_bytes = (size_t)(a.k / F::COLS) * 16, side_bytes = (size_t)(a.k / F::GROUP) * F::SIDE;
    const uint32_t ra = min(f0 + g, a.n - 1), rb = min(f0 + g + 8, a.n - 1);
    const unsigned char* w0 = a.q + ra * row_bytes;
    const unsigned char* w1 = a.q + rb * row_bytes;
    const unsigned char* s0 = a.side + ra * side_bytes;
    const unsigned char* s1 = a.side + rb * side_bytes;
    QStep<F> sa, sb;
    qload<F>(sa, w0, w1, s0, s1, 32 * q, a.k);
    if (steps > 1) qload<F>(sb, w0, w1, s0, s1, QK + 32 * q, a.k);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < QS - 1; s++) {
        if ((uint32_t)s < steps) qstage(qgemm_xs + s * QR * QU, a, r0, s);
        cp_commit();
    }
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (uint32_t c = 0; c < steps; c++) {
        cp_wait<QS - 2>();
        __syncthreads();
        // the stage read at c - 1, free once every warp passed the barrier
        const uint32_t next = c + QS - 1;
        if (next < steps) qstage(qgemm_xs + (next % QS) * QR * QU, a, r0, next);
        cp_commit();
        const uint4* xs = qgemm_xs + (c % QS) * QR * QU;
        if (c % 2 == 0)
            qstep<F>(sa, xs, acc, tiles, c, steps, q, g, w0, w1, s0, s1, a.k);
        else
            qstep<F>(sb, xs, acc, tiles, c, steps, q, g, w0, w1, s0, s1, a.k);
    }
    cp_wait_all();
    pdl_launch_dependents();
    // accumulator element e of lane (g, q), tile j: weight row g + 8 (e / 2),
    // input row 8 j + 2 q + e % 2
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t f = f0 + g + 8 * (e >> 1), row = r0 + 8 * j + 2 * q + (e & 1);
            if (f < a.n && row < a.m) a.y[(size_t)row * a.n + f] = f2bf(acc[j][e]);
        }
    }
}

}  // namespace

#define QGEMM(NAME, F) \
    extern "C" __global__ void __launch_bounds__(LAMINA_QGEMM_WARPS * 32) qgemm_##NAME(const QgemmArgs a) { qgemm<F>(a); }
QGEMM(q8_0, FmtQ8_0)
QGEMM(q4_0, FmtQ4_0)
QGEMM(q4_1, FmtQ4_1)
QGEMM(q4_k, FmtQ4K)
QGEMM(q5_k, FmtQ5K)
QGEMM(q6_k, FmtQ6K)
QGEMM(int4, FmtInt4)
