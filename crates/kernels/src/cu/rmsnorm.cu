// RMSNorm fused with the residual add.
// add_rmsnorm: for each row t: if delta != null, residual[t] += delta[t];
//   out[t] = residual[t] * rsqrt(mean(residual[t]^2) + eps) * weight.
//   The residual stream stays f32; out is bf16 (the next GEMM's input).
//   grid = T blocks, block = 256 threads (multiple of 32).
#include "common.cuh"

extern "C" __global__ void add_rmsnorm(float* __restrict__ residual,      // [T, hidden]
                                       const bf16* __restrict__ delta,    // [T, hidden] or null
                                       const bf16* __restrict__ weight,   // [hidden]
                                       bf16* __restrict__ out,            // [T, hidden]
                                       uint32_t hidden, float eps) {
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
    float inv = rsqrtf(ss / (float)hidden + eps);
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[base + i] = f2bf(x[i] * inv * bf2f(weight[i]));
}
