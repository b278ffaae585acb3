// FP8 (e4m3) weights widened for the tensor-core path: out[r, c] =
// bf16(decode(q[r, c]) * scale[r]), one row-scaled [n, k] matrix at a time
// into a bf16 buffer the cuBLAS GEMM then reads. Grid-stride over 8-byte
// chunks (8 weights: one 8-byte load, one 16-byte store); k % 8 == 0.
// Block LAMINA_ROW_THREADS, at most LAMINA_SILU_MAX_BLOCKS blocks.
// fp8_quant_rows: activations quantised per row for the FP8 tensor-core
// GEMMs, as ops::fp8::quantize_rows does: scale[r] = max|x[r, :]| /
// LAMINA_FP8_E4M3_MAX (1 for a zero or non-finite row), q[r, c] =
// e4m3(x[r, c] / scale[r]), nearest even, saturating. One block of
// LAMINA_ROW_THREADS per row: a max reduction, then the encode.
// Each takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include <cuda_fp8.h>

#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

extern "C" __global__ void __launch_bounds__(LAMINA_ROW_THREADS) fp8_quant_rows(const Fp8QuantArgs a) {
    const bf16* __restrict__ x = a.x + (size_t)blockIdx.x * a.k;
    uint8_t* __restrict__ q = a.q + (size_t)blockIdx.x * a.k;
    float m = 0.f;
    for (uint32_t c = threadIdx.x; c < a.k; c += LAMINA_ROW_THREADS) m = fmaxf(m, fabsf(bf2f(x[c])));
    __shared__ float sm[LAMINA_ROW_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = 0.f;
#pragma unroll
    for (int w = 0; w < LAMINA_ROW_THREADS / 32; w++) amax = fmaxf(amax, sm[w]);
    const float s = (amax > 0.f && isfinite(amax)) ? amax / (float)LAMINA_FP8_E4M3_MAX : 1.f;
    if (threadIdx.x == 0) a.scale[blockIdx.x] = s;
    for (uint32_t c = threadIdx.x; c < a.k; c += LAMINA_ROW_THREADS)
        q[c] = __nv_cvt_float_to_fp8(bf2f(x[c]) / s, __NV_SATFINITE, __NV_E4M3);
}

extern "C" __global__ void fp8_dequant_rows(const Fp8DequantArgs a) {
    const uint2* __restrict__ q = reinterpret_cast<const uint2*>(a.q);  // [n, k / 8] chunks
    uint4* __restrict__ out = reinterpret_cast<uint4*>(a.out);          // [n, k / 8] chunks
    const uint32_t c8 = a.k / 8;
    const size_t total = (size_t)a.n * c8;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const float s = a.scale[i / c8];
        const uint2 raw = q[i];
        const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
        uint4 o;
        __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 t = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p[e], __NV_E4M3)));
            oh[e] = __floats2bfloat162_rn(t.x * s, t.y * s);
        }
        out[i] = o;
    }
}
