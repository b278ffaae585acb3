// SwiGLU activation: out[t, i] = silu(gu[t, i]) * gu[t, inter + i], where
// gu = [gate | up] is the fused gate/up GEMM output. Grid-stride over T*inter
// (block LAMINA_ROW_THREADS, at most LAMINA_SILU_MAX_BLOCKS blocks).
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"

extern "C" __global__ void silu_mul(const SiluMulArgs a) {
    bf16* __restrict__ out = a.out;                // [T, inter]
    const bf16* __restrict__ gu = a.gu;            // [T, 2 inter]
    const uint32_t inter = a.inter;
    size_t n = (size_t)a.tokens * inter;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / inter, i = k % inter;
        float g = bf2f(gu[t * 2 * inter + i]);
        float u = bf2f(gu[t * 2 * inter + inter + i]);
        out[k] = f2bf(g / (1.f + __expf(-g)) * u);
    }
}
