// RoPE (rotate-half, Hugging Face order) from one precomputed f32 table,
// fused with writing K and V into the paged cache.
// rope_kv_write: per token t (grid = T blocks):
//   q heads of qkv[t] are rotated in place; k heads are rotated and written to
//   k_cache[slot[t]]; v heads are copied to v_cache[slot[t]].
//   qkv row = [q (n_heads*D) | k (n_kv*D) | v (n_kv*D)], bf16.
//   cache layout [slots, n_kv, D] bf16, slot = block * block_size + offset;
//   with kv_fp8 the caches hold e4m3 bytes, k stored as e4m3(k / k_scale)
//   and v as e4m3(v / v_scale) (kv.cuh; the bf16 path below is unchanged).
//   cos/sin tables [max_pos, D/2] f32 (ModelConfig::rope_table), shared with decode.
//   positions >= max_pos are rejected on the host; the kernel skips them.
//   with kv_rotate (FP8 at calibrated K scales) every q and k head is
//   Hadamard-rotated after RoPE (hadamard.cuh), one warp a head.
// Even D / 2: two rotation pairs per thread (bf16x2, float2); V rows copied
// 16 bytes at a time when aligned.
// Takes its one argument struct (lamina_args.cuh, from src/abi.rs); block
// LAMINA_ROPE_THREADS.
#include "common.cuh"
#include "hadamard.cuh"
#include "kv.cuh"
#include "lamina_args.cuh"

// The rotating cache's write: each warp ropes and rotates whole q and k
// heads in registers (q back into qkv as bf16, k into the cache); v as
// rope_kv_write_fp8 stores it.
__device__ __forceinline__ void rope_kv_write_rotated(const RopeKvArgs& a) {
    const uint32_t n_heads = a.n_heads, n_kv = a.n_kv, D = a.head_dim;
    const uint32_t t = blockIdx.x, pos = a.positions[t];
    if (pos >= a.max_pos) return;
    const size_t slot = a.slots[t];
    bf16* row = a.qkv + (size_t)t * (n_heads + 2 * n_kv) * D;  // [(n_heads + 2 n_kv) D]
    const float* c = a.cos_t + (size_t)pos * (D / 2);          // [D/2]
    const float* s = a.sin_t + (size_t)pos * (D / 2);          // [D/2]
    const uint32_t warps = blockDim.x / 32;
    for (uint32_t h = threadIdx.x / 32; h < n_heads + n_kv; h += warps) {
        float v[HADAMARD_SLOTS];
        hadamard_load(row + (size_t)h * D, D, v);
        hadamard_rope(v, D, c, s);
        hadamard_rotate(v, D);
        if (h < n_heads)
            hadamard_store(v, D, row + (size_t)h * D, nullptr, 0, false, 1.f);
        else
            hadamard_store(v, D, nullptr, a.k_cache, (slot * n_kv + (h - n_heads)) * D, a.kv_fp8, a.k_scale);
    }
    const bf16* vr = row + (size_t)(n_heads + n_kv) * D;
    for (uint32_t i = threadIdx.x; i < n_kv * D; i += blockDim.x)
        kv_store(a.v_cache, slot * n_kv * D + i, bf2f(vr[i]), a.kv_fp8, a.v_scale);
}

// The FP8 cache's write: the rotation of the bf16 path in f32, each k and v
// value stored as one e4m3 byte.
__device__ __forceinline__ void rope_kv_write_fp8(const RopeKvArgs& a) {
    const uint32_t n_heads = a.n_heads, n_kv = a.n_kv, D = a.head_dim;
    const uint32_t t = blockIdx.x, pos = a.positions[t];
    if (pos >= a.max_pos) return;
    const size_t slot = a.slots[t];
    const uint32_t half = D / 2;
    bf16* row = a.qkv + (size_t)t * (n_heads + 2 * n_kv) * D;
    const float* c = a.cos_t + (size_t)pos * half;
    const float* s = a.sin_t + (size_t)pos * half;
    uint8_t* kc = static_cast<uint8_t*>(a.k_cache) + slot * n_kv * D;
    uint8_t* vc = static_cast<uint8_t*>(a.v_cache) + slot * n_kv * D;
    const uint32_t pairs = (n_heads + n_kv) * half;
    for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        const uint32_t h = i / half, j = i % half;
        bf16* b = row + (size_t)h * D;
        const float x1 = bf2f(b[j]), x2 = bf2f(b[j + half]);
        const float o1 = x1 * c[j] - x2 * s[j];
        const float o2 = x2 * c[j] + x1 * s[j];
        if (h < n_heads) {
            b[j] = f2bf(o1);
            b[j + half] = f2bf(o2);
        } else {
            uint8_t* dst = kc + (size_t)(h - n_heads) * D;
            dst[j] = kv_fp8_encode(o1, a.k_scale);
            dst[j + half] = kv_fp8_encode(o2, a.k_scale);
        }
    }
    const bf16* v = row + (size_t)(n_heads + n_kv) * D;
    for (uint32_t i = threadIdx.x; i < n_kv * D; i += blockDim.x) vc[i] = kv_fp8_encode(bf2f(v[i]), a.v_scale);
}

extern "C" __global__ void rope_kv_write(const RopeKvArgs a) {
    if (a.kv_rotate) {
        rope_kv_write_rotated(a);
        return;
    }
    if (a.kv_fp8) {
        rope_kv_write_fp8(a);
        return;
    }
    bf16* __restrict__ qkv = a.qkv;                      // [T, (n_heads + 2 n_kv) D]
    const uint32_t* __restrict__ positions = a.positions; // [T]
    const uint32_t* __restrict__ slots = a.slots;         // [T]
    const float* __restrict__ cos_t = a.cos_t;            // [max_pos, D/2]
    const float* __restrict__ sin_t = a.sin_t;            // [max_pos, D/2]
    bf16* __restrict__ k_cache = static_cast<bf16*>(a.k_cache); // [slots, n_kv, D]
    bf16* __restrict__ v_cache = static_cast<bf16*>(a.v_cache); // [slots, n_kv, D]
    const uint32_t n_heads = a.n_heads, n_kv = a.n_kv, head_dim = a.head_dim, max_pos = a.max_pos;
    uint32_t t = blockIdx.x;
    uint32_t pos = positions[t];
    if (pos >= max_pos) return;
    size_t slot = slots[t];
    uint32_t half = head_dim / 2;
    bf16* row = qkv + (size_t)t * (n_heads + 2 * n_kv) * head_dim;
    const float* c = cos_t + (size_t)pos * half;
    const float* s = sin_t + (size_t)pos * half;
    if (half % 2 == 0) {
        // two adjacent pairs (j, j + 1) per thread: bf16x2 / float2 accesses
        const uint32_t h2 = half / 2, quads = (n_heads + n_kv) * h2;
        for (uint32_t i = threadIdx.x; i < quads; i += blockDim.x) {
            const uint32_t h = i / h2, j = (i - h * h2) * 2;
            bf16* b = row + (size_t)h * head_dim;
            const float2 x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(b + j));
            const float2 x2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(b + j + half));
            const float2 cj = *reinterpret_cast<const float2*>(c + j), sj = *reinterpret_cast<const float2*>(s + j);
            const __nv_bfloat162 o1 = __floats2bfloat162_rn(x1.x * cj.x - x2.x * sj.x, x1.y * cj.y - x2.y * sj.y);
            const __nv_bfloat162 o2 = __floats2bfloat162_rn(x2.x * cj.x + x1.x * sj.x, x2.y * cj.y + x1.y * sj.y);
            bf16* dst = h < n_heads ? b : k_cache + (slot * n_kv + (h - n_heads)) * head_dim;
            *reinterpret_cast<__nv_bfloat162*>(dst + j) = o1;
            *reinterpret_cast<__nv_bfloat162*>(dst + j + half) = o2;
        }
    } else {
        const uint32_t pairs = (n_heads + n_kv) * half;
        for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
            const uint32_t h = i / half, j = i % half;
            bf16* b = row + (size_t)h * head_dim;
            const float x1 = bf2f(b[j]), x2 = bf2f(b[j + half]);
            const float o1 = x1 * c[j] - x2 * s[j];
            const float o2 = x2 * c[j] + x1 * s[j];
            bf16* dst = h < n_heads ? b : k_cache + (slot * n_kv + (h - n_heads)) * head_dim;
            dst[j] = f2bf(o1);
            dst[j + half] = f2bf(o2);
        }
    }
    const bf16* v = row + (size_t)(n_heads + n_kv) * head_dim;
    bf16* vc = v_cache + slot * n_kv * head_dim;
    const uint32_t nv = n_kv * head_dim;
    if (nv % 8 == 0 && ((uintptr_t)v % 16) == 0 && ((uintptr_t)vc % 16) == 0) {
        for (uint32_t i = threadIdx.x; i < nv / 8; i += blockDim.x)
            reinterpret_cast<uint4*>(vc)[i] = reinterpret_cast<const uint4*>(v)[i];
    } else {
        for (uint32_t i = threadIdx.x; i < nv; i += blockDim.x) vc[i] = v[i];
    }
}
