// The K/V cache's element codecs (src/kv.rs): bf16, or FP8 e4m3 bytes at a
// per-layer scale. A write stores e4m3(x / scale), rounded to nearest even
// and saturated at +-448 (ops::fp8::encode); a read widens decode(b), exact
// through half, and the reader multiplies by the scale (or folds it into
// its softmax scale for K and its output for V).
#pragma once
#include <cuda_fp8.h>

#include "common.cuh"

// The stored e4m3 byte of x at `scale`.
__device__ __forceinline__ uint8_t kv_fp8_encode(float x, float scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}

// Two e4m3 bytes (low byte first) widened exactly to f32.
__device__ __forceinline__ float2 kv_fp8x2_to_float2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3);
    return __half22float2(__half2(h));
}

// Two e4m3 bytes widened exactly to a bf16 pair (every e4m3 value is a bf16).
__device__ __forceinline__ __nv_bfloat162 kv_fp8x2_to_bf162(uint32_t two) {
    return __float22bfloat162_rn(kv_fp8x2_to_float2(two));
}

// Eight e4m3 bytes (a uint2, element 0 in the low byte of x) times `scale`.
__device__ __forceinline__ void kv_fp8x8_to_float(const uint2 raw, float* f, float scale) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t w = i < 2 ? raw.x : raw.y;
        const float2 t = kv_fp8x2_to_float2(w >> (16 * (i & 1)));
        f[2 * i] = t.x * scale;
        f[2 * i + 1] = t.y * scale;
    }
}

// Eight e4m3 bytes widened to eight bf16 (a uint4).
__device__ __forceinline__ uint4 kv_fp8x8_to_bf16x8(const uint2 raw) {
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t w = i < 2 ? raw.x : raw.y;
        const __nv_bfloat162 b = kv_fp8x2_to_bf162(w >> (16 * (i & 1)));
        o[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
    return out;
}

// One f32 value stored into a cache of bf16 (fp8 = false) or e4m3 bytes at `scale`.
__device__ __forceinline__ void kv_store(void* cache, size_t i, float x, bool fp8, float scale) {
    if (fp8)
        static_cast<uint8_t*>(cache)[i] = kv_fp8_encode(x, scale);
    else
        static_cast<bf16*>(cache)[i] = f2bf(x);
}
