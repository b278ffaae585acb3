// SwiGLU activation: out[t, i] = silu(gu[t, i]) * gu[t, inter + i], where
// gu = [gate | up] is the fused gate/up GEMM output. Grid-stride over T*inter.
#include "common.cuh"

extern "C" __global__ void silu_mul(bf16* __restrict__ out,        // [T, inter]
                                    const bf16* __restrict__ gu,   // [T, 2 inter]
                                    uint32_t tokens, uint32_t inter) {
    size_t n = (size_t)tokens * inter;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / inter, i = k % inter;
        float g = bf2f(gu[t * 2 * inter + i]);
        float u = bf2f(gu[t * 2 * inter + inter + i]);
        out[k] = f2bf(g / (1.f + __expf(-g)) * u);
    }
}
