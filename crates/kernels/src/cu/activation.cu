// Gated activations: out[t, i] = act(gu[t, i]) * gu[t, inter + i], where
// gu = [gate | up] is the fused gate/up GEMM output; act is SiLU
// (silu_mul, SwiGLU) or GELU with the tanh approximation (gelu_tanh_mul,
// GeGLU). Grid-stride over the
// row's 16-byte chunks (8 elements: one uint4 load of gate, one of up, one
// store) when inter % 8 == 0 and both pointers are 16-byte aligned, else over
// single elements; 32-bit index arithmetic (the launcher bounds T * inter).
// Block LAMINA_ROW_THREADS, at most LAMINA_SILU_MAX_BLOCKS blocks.
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "activation.cuh"
#include "common.cuh"
#include "lamina_args.cuh"

struct Silu {
    __device__ __forceinline__ float operator()(float g) const { return silu_f(g); }
};
struct GeluTanh {
    __device__ __forceinline__ float operator()(float g) const { return gelu_tanh_f(g); }
};

template <typename Act>
__device__ __forceinline__ void gated(const GatedArgs& a, Act act) {
    bf16* __restrict__ out = a.out;                // [T, inter]
    const bf16* __restrict__ gu = a.gu;            // [T, 2 inter]
    const uint32_t inter = a.inter;
    const uint32_t stride = gridDim.x * blockDim.x;
    const bool vec = inter % 8 == 0 && ((uintptr_t)out % 16) == 0 && ((uintptr_t)gu % 16) == 0;
    if (vec) {
        const uint32_t c8 = inter / 8, n = a.tokens * c8;
        for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
            const uint32_t t = k / c8, c = k - t * c8;
            const uint4* row = reinterpret_cast<const uint4*>(gu + (size_t)t * 2 * inter);
            const uint4 g4 = row[c], u4 = row[c8 + c];
            const __nv_bfloat162* g = reinterpret_cast<const __nv_bfloat162*>(&g4);
            const __nv_bfloat162* u = reinterpret_cast<const __nv_bfloat162*>(&u4);
            uint4 o4;
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&o4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 gf = __bfloat1622float2(g[e]), uf = __bfloat1622float2(u[e]);
                o[e] = __floats2bfloat162_rn(act(gf.x) * uf.x, act(gf.y) * uf.y);
            }
            reinterpret_cast<uint4*>(out)[k] = o4;
        }
        return;
    }
    const uint32_t n = a.tokens * inter;
    for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        const uint32_t t = k / inter, i = k - t * inter;
        const float g = bf2f(gu[(size_t)t * 2 * inter + i]);
        const float u = bf2f(gu[(size_t)t * 2 * inter + inter + i]);
        out[k] = f2bf(act(g) * u);
    }
}

extern "C" __global__ void silu_mul(const GatedArgs a) { gated(a, Silu{}); }

extern "C" __global__ void gelu_tanh_mul(const GatedArgs a) { gated(a, GeluTanh{}); }
