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

extern "C" __global__ void head_rmsnorm(const HeadRmsnormArgs a) {
    const uint32_t heads = a.q_heads + a.k_heads;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.tokens * heads) return;
    const uint32_t t = warp / heads, h = warp - t * heads;
    bf16* __restrict__ v = a.x + (size_t)t * a.row + (size_t)h * a.head_dim;  // [head_dim]
    const bf16* __restrict__ gain = h < a.q_heads ? a.q_gain : a.k_gain;    // [head_dim]
    float ss = 0.f;
    for (uint32_t i = lane; i < a.head_dim; i += 32) {
        const float x = bf2f(v[i]);
        ss += x * x;
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)a.head_dim + a.eps);
    for (uint32_t i = lane; i < a.head_dim; i += 32) v[i] = f2bf(bf2f(v[i]) * inv * (a.offset + bf2f(gain[i])));
}

extern "C" __global__ void softcap_rows(const SoftcapArgs a) {
    float* __restrict__ y = a.y;  // [n]
    for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < a.n; k += gridDim.x * blockDim.x)
        y[k] = a.cap * tanhf(y[k] / a.cap);
}
