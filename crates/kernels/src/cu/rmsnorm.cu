// RMSNorm fused with the residual add.
// add_rmsnorm: for each row t: if delta != null, residual[t] += delta[t];
//   out[t] = residual[t] * rsqrt(mean(residual[t]^2) + eps) * weight.
//   The residual stream stays f32; out is bf16 (the next GEMM's input).
//   grid = T blocks, block = LAMINA_ROW_THREADS (a multiple of 32).
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

static_assert(LAMINA_ROW_THREADS % 32 == 0 && LAMINA_ROW_THREADS <= LAMINA_MAX_THREADS_PER_BLOCK,
              "block_sum needs whole warps");

extern "C" __global__ void add_rmsnorm(const AddRmsnormArgs a) {
    float* __restrict__ residual = a.residual;     // [T, hidden]
    const bf16* __restrict__ delta = a.delta;      // [T, hidden] or null
    const bf16* __restrict__ weight = a.weight;    // [hidden]
    bf16* __restrict__ out = a.out;                // [T, hidden]
    const uint32_t hidden = a.hidden;
    __shared__ float scratch[32];
    size_t base = (size_t)blockIdx.x * hidden;
    float* x = residual + base;
    float ss = 0.f;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = x[i];
        if (delta != nullptr) {
            v += bf2f(delta[base + i]);
            x[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)hidden + a.eps);
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[base + i] = f2bf(x[i] * inv * bf2f(weight[i]));
}
