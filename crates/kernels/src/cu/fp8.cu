// FP8 (e4m3) weights widened for the tensor-core path: out[r, c] =
// bf16(decode(q[r, c]) * scale[r]), one row-scaled [n, k] matrix at a time
// into a bf16 buffer the cuBLAS GEMM then reads. Grid-stride over 8-byte
// chunks (8 weights: one 8-byte load, one 16-byte store); k % 8 == 0.
// Block LAMINA_ROW_THREADS, at most LAMINA_SILU_MAX_BLOCKS blocks.
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include <cuda_fp8.h>

#include "common.cuh"
#include "lamina_args.cuh"

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
