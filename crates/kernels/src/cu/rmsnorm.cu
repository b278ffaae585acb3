// RMSNorm fused with the residual add.
// add_rmsnorm: for each row t: if delta != null, residual[t] += delta[t];
//   out[t] = residual[t] * rsqrt(mean(residual[t]^2) + eps) * (offset + weight).
//   The residual stream stays f32; out is bf16 (the next GEMM's input).
//   grid = T blocks, block = LAMINA_ROW_THREADS (a multiple of 32).
//   When hidden % 4 == 0 and every pointer is aligned for it, each thread
//   moves 4 elements per access (float4 residual, 8-byte bf16 quads); the
//   second pass re-reads the row this thread wrote (L1-resident).
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

static_assert(LAMINA_ROW_THREADS % 32 == 0 && LAMINA_ROW_THREADS <= LAMINA_MAX_THREADS_PER_BLOCK,
              "block_sum needs whole warps");

struct alignas(8) bf16x4 {
    __nv_bfloat162 lo, hi;
};

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
    const bool vec = hidden % 4 == 0 && ((uintptr_t)residual % 16) == 0 && ((uintptr_t)delta % 8) == 0 &&
                     ((uintptr_t)weight % 8) == 0 && ((uintptr_t)out % 8) == 0;
    if (vec) {
        const uint32_t n4 = hidden / 4;
        float4* x4 = reinterpret_cast<float4*>(x);
        const bf16x4* d4 = reinterpret_cast<const bf16x4*>(delta + base);
        for (uint32_t i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = x4[i];
            if (delta != nullptr) {
                const bf16x4 d = d4[i];
                const float2 lo = __bfloat1622float2(d.lo), hi = __bfloat1622float2(d.hi);
                v.x += lo.x, v.y += lo.y, v.z += hi.x, v.w += hi.y;
                x4[i] = v;
            }
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_sum(ss, scratch);
        const float inv = rsqrtf(ss / (float)hidden + a.eps);
        const bf16x4* w4 = reinterpret_cast<const bf16x4*>(weight);
        bf16x4* o4 = reinterpret_cast<bf16x4*>(out + base);
        for (uint32_t i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 v = x4[i];
            const bf16x4 w = w4[i];
            const float2 wl = __bfloat1622float2(w.lo), wh = __bfloat1622float2(w.hi);
            bf16x4 o;
            const float f = a.offset;
            o.lo = __floats2bfloat162_rn(v.x * inv * (f + wl.x), v.y * inv * (f + wl.y));
            o.hi = __floats2bfloat162_rn(v.z * inv * (f + wh.x), v.w * inv * (f + wh.y));
            o4[i] = o;
        }
        return;
    }
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
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) out[base + i] = f2bf(x[i] * inv * (a.offset + bf2f(weight[i])));
}
