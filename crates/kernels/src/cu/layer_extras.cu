// The layer steps a model spec adds around the projections.
// bias_rows: y[t, c] += bias[c] over a [T, width] bf16 matrix, in place
//   (f32 add, one bf16 rounding); grid-stride over T * width elements,
//   block LAMINA_ROW_THREADS.
// head_rmsnorm: per-head RMSNorm in place (QK-norm): in each row of x
//   ([T, row]), the q_heads heads of head_dim from column 0 are scaled by
//   rsqrt(mean(head^2) + eps) * (offset + q_gain), the k_heads heads after
//   them by (offset + k_gain). One warp per (token, head), sums in f32;
//   blocks of LAMINA_ROW_THREADS threads. One head as wide as the row is a
//   whole-row RMSNorm (the spec's output norms).
// softcap_rows: y = cap * tanh(y / cap) over n f32 values, in place
//   (the final logits' soft-cap); grid-stride, block LAMINA_ROW_THREADS.
// Each takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

extern "C" __global__ void bias_rows(const BiasRowsArgs a) {
    bf16* __restrict__ y = a.y;                 // [T, width]
    const bf16* __restrict__ bias = a.bias;     // [width]
    const uint32_t width = a.width, n = a.tokens * a.width;
    for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        y[k] = f2bf(bf2f(y[k]) + bf2f(bias[k % width]));
    }
}

// Columns a lane of head_rmsnorm loads at once.
#define HEAD_NORM_BATCH 8

extern "C" __global__ void head_rmsnorm(const HeadRmsnormArgs a) {
    const uint32_t heads = a.q_heads + a.k_heads;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.tokens * heads) return;
    const uint32_t t = warp / heads, h = warp - t * heads;
    bf16* __restrict__ v = a.x + (size_t)t * a.row + (size_t)h * a.head_dim;  // [head_dim]
    const bf16* __restrict__ gain = h < a.q_heads ? a.q_gain : a.k_gain;    // [head_dim]
    // Lane l owns columns l, l + 32, ..., taken HEAD_NORM_BATCH at a time:
    // a batch's loads are all issued before they are used (a 256-wide head
    // is one batch, a 640-wide row three), not one round trip a column.
    constexpr int B = HEAD_NORM_BATCH;
    const uint32_t n = a.head_dim;
    float ss = 0.f;
    for (uint32_t i0 = lane; i0 < n; i0 += 32 * B) {
        float x[B];
#pragma unroll
        for (int j = 0; j < B; j++) x[j] = i0 + 32 * j < n ? bf2f(v[i0 + 32 * j]) : 0.f;
#pragma unroll
        for (int j = 0; j < B; j++) ss += x[j] * x[j];
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)n + a.eps);
    for (uint32_t i0 = lane; i0 < n; i0 += 32 * B) {
        float x[B], g[B];
#pragma unroll
        for (int j = 0; j < B; j++) {
            const uint32_t i = min(i0 + 32 * j, n - 1);  // in range; stored only below n
            x[j] = bf2f(v[i]);
            g[j] = a.offset + bf2f(gain[i]);
        }
#pragma unroll
        for (int j = 0; j < B; j++)
            if (i0 + 32 * j < n) v[i0 + 32 * j] = f2bf(x[j] * inv * g[j]);
    }
}

extern "C" __global__ void softcap_rows(const SoftcapArgs a) {
    float* __restrict__ y = a.y;  // [n]
    for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < a.n; k += gridDim.x * blockDim.x)
        y[k] = a.cap * tanhf(y[k] / a.cap);
}
