// The weight formats the GEMVs (cu/gemv.cu) and the block widening
// (cu/gguf.cu) read, one type each: the `gemv::WeightFormat` of the launchers.
//
// A row of K weights is K / COLS 16-byte chunks (row r at r * K / COLS * 16
// bytes of `w`); a lane loads one chunk and widens its COLS weights to f32
// in column order. SCALED formats multiply each row's dot by its scale
// (`w_side` as `const float*`, one per row). Block formats keep their
// scales beside the chunks: `w_side` holds, per row, K / GROUP records of
// SIDE bytes, record g for columns [g * GROUP, (g + 1) * GROUP); a chunk's
// record fields are loaded with its chunk (`Side`), before the PDL wait.
//
// Each type's device layout is written by the uploader (the model crate's
// `cuda::gguf::pack`), from ggml's blocks (`ggml-common.h`); the doc of each
// type states it. 4-bit quants ("nibble chunks") are 32 columns a chunk:
// byte b holds column b in its low nibble and column b + 16 in its high one
// (ggml's Q4_0 / Q4_1 `qs` as they are; the K formats' quants reordered).
// f16 fields are ggml's bits. Arithmetic follows ggml's dequantisers in f32,
// unfused (__fmul_rn / __fadd_rn), so widened weights equal the CPU's. Codes
// become floats through the exponent of 2^23 (`code_f`: one bitwise op and
// one add, exact), not int-to-float conversions, which Hopper issues at an
// eighth of the f32 rate: at 32 a chunk they, not the bytes, bounded the
// 4-bit GEMVs.
// AFFINE formats' chunks are scale * code + offset with one scale and one
// offset a chunk (`codes`: the codes as exact floats, the scale, the
// offset): the GEMVs sum code * x and x and apply them once a chunk
// (gemv.cu gemv_affine_chunk), not per weight; `widen` stays the CPU's
// arithmetic for the widening kernels.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "lamina_consts.cuh"

// Relaxed loads that stay ahead of the PDL wait (see ld_before_wait in pdl.cuh).
__device__ __forceinline__ uint32_t ld_side_u16(const unsigned char* p) {
    unsigned short v;
    asm volatile("ld.relaxed.gpu.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_side_u32(const unsigned char* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_side_u64(const unsigned char* p) {
    uint2 v;
    asm volatile("ld.relaxed.gpu.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ld_side_u128(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// (float)q - bias for 0 <= q < 2^23, exactly: 2^23 + q has q as its low
// mantissa bits (`bias` is the integer subtracted, at most 2^23).
template <uint32_t BIAS>
__device__ __forceinline__ float code_f(uint32_t q) {
    return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f + (float)BIAS);
}

__device__ __forceinline__ float f16_bits(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xFFFFu)));
}

// Eight e4m3 weights widened to f32.
__device__ __forceinline__ void fp8x8(const uint2 raw, float* f) {
    const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p[i], __NV_E4M3)));
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// The 32 codes of a nibble chunk (module doc), in column order.
__device__ __forceinline__ void nibbles32(const uint4& raw, uint32_t* q) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
        q[i] = byte & 0xFu;
        q[i + 16] = byte >> 4;
    }
}

// The 32 codes of a nibble chunk (module doc) in column order as floats
// minus BIAS, exactly as code_f makes them: one byte permute puts a code
// under the exponent of 2^23 (bytes 0x4B, 0, 0, code), one subtraction.
template <uint32_t BIAS>
__device__ __forceinline__ void nibbles32_f(const uint4& raw, float* f) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t lo = w[k] & 0x0F0F0F0Fu, hi = (w[k] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            f[4 * k + b] = __fsub_rn(__uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7650u | b)), 8388608.0f + (float)BIAS);
            f[4 * k + b + 16] = __fsub_rn(__uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7650u | b)), 8388608.0f + (float)BIAS);
        }
    }
}

// The 6-bit scale and min of sub-block j (0..8) of a Q4_K / Q5_K block from
// its 12 packed bytes (ggml's get_scale_min_k4), `hdr` the block's first 16
// bytes: d, dmin, scales[12].
// (The scales' words are picked by j < 4, not indexed: an array indexed by
// a lane's j would live in local memory.)
__device__ __forceinline__ void k4_scale_min(const uint4& hdr, uint32_t j, float& sc, float& mn) {
    // byte j % 4 of scales[0..4], [4..8], [8..12]
    const uint32_t jj = j & 3u;
    const uint32_t s0 = __byte_perm(hdr.y, 0u, 0x4440u | jj), s1 = __byte_perm(hdr.z, 0u, 0x4440u | jj),
                   s2 = __byte_perm(hdr.w, 0u, 0x4440u | jj);
    uint32_t a, b;
    if (j < 4) {
        a = s0 & 63u;
        b = s1 & 63u;
    } else {
        a = (s2 & 0xFu) | ((s0 >> 6) << 4);
        b = (s2 >> 4) | ((s1 >> 6) << 4);
    }
    sc = code_f<0>(a);
    mn = code_f<0>(b);
}

struct NoSide {};

struct FmtBf16 {  // 8 bf16 weights a chunk
    static constexpr uint32_t COLS = 8, GROUP = COLS, SIDE = 0;
    static constexpr bool SCALED = false, AFFINE = false;
    typedef NoSide Side;
    static __device__ __forceinline__ Side side(const unsigned char*, uint32_t) { return {}; }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side&, uint32_t, float* f) { bf8(raw, f); }
};
struct FmtFp8Row {  // 16 e4m3 weights a chunk, one f32 scale a row
    static constexpr uint32_t COLS = LAMINA_GEMV_FP8_COLS, GROUP = COLS, SIDE = 0;
    static constexpr bool SCALED = true, AFFINE = false;
    typedef NoSide Side;
    static __device__ __forceinline__ Side side(const unsigned char*, uint32_t) { return {}; }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side&, uint32_t, float* f) {
        fp8x8(make_uint2(raw.x, raw.y), f);
        fp8x8(make_uint2(raw.z, raw.w), f + 8);
    }
};
// Q8_0: chunks of 16 int8 codes; records (2 bytes per 32 columns): the
// block's f16 d. w = q * d.
struct FmtQ8_0 {
    static constexpr uint32_t COLS = LAMINA_GGUF_Q8_COLS, GROUP = LAMINA_GGUF_BLOCK, SIDE = LAMINA_GGUF_Q8_0_SIDE;
    static constexpr bool SCALED = false, AFFINE = false;
    struct Side {
        uint32_t d;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t) { return {ld_side_u16(rec)}; }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t, float* f) {
        const float d = f16_bits(s.d);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 16; i++) f[i] = __fmul_rn(code_f<128>(((w[i / 4] >> (8 * (i % 4))) & 0xFFu) ^ 0x80u), d);
    }
};
// Q4_0: nibble chunks (ggml's qs); records (2 bytes per 32 columns): d.
// w = (q - 8) * d.
struct FmtQ4_0 {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_BLOCK, SIDE = LAMINA_GGUF_Q4_0_SIDE;
    static constexpr bool SCALED = false, AFFINE = true;
    struct Side {
        uint32_t d;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t) { return {ld_side_u16(rec)}; }
    // scale d, offset -8 d (exact)
    static __device__ __forceinline__ void codes(const uint4& raw, const Side& s, uint32_t, float* q, float& scale,
                                                 float& offset) {
        scale = f16_bits(s.d);
        offset = -8.f * scale;
        nibbles32_f<0>(raw, q);
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t, float* f) {
        const float d = f16_bits(s.d);
        nibbles32_f<8>(raw, f);
#pragma unroll
        for (int i = 0; i < 32; i++) f[i] = __fmul_rn(f[i], d);
    }
};
// Q4_1: nibble chunks (ggml's qs); records (4 bytes per 32 columns): d, m.
// w = q * d + m.
struct FmtQ4_1 {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_BLOCK, SIDE = LAMINA_GGUF_Q4_1_SIDE;
    static constexpr bool SCALED = false, AFFINE = true;
    struct Side {
        uint32_t dm;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t) { return {ld_side_u32(rec)}; }
    static __device__ __forceinline__ void codes(const uint4& raw, const Side& s, uint32_t, float* q, float& scale,
                                                 float& offset) {
        scale = f16_bits(s.dm);
        offset = f16_bits(s.dm >> 16);
        nibbles32_f<0>(raw, q);
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t kk, float* f) {
        float d, m;
        codes(raw, s, kk, f, d, m);
#pragma unroll
        for (int i = 0; i < 32; i++) f[i] = __fadd_rn(__fmul_rn(f[i], d), m);
    }
};
// Q4_K: nibble chunks, sub-block j of a block its chunk j; records (16
// bytes per 256 columns): the block's d, dmin, scales[12] as ggml stores
// them. w = d * sc_j * q - dmin * m_j.
struct FmtQ4K {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_SUPER_BLOCK, SIDE = LAMINA_GGUF_Q4_K_SIDE;
    static constexpr bool SCALED = false, AFFINE = true;
    struct Side {
        uint4 hdr;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t) { return {ld_side_u128(rec)}; }
    // scale d * sc_j, offset -(dmin * m_j)
    static __device__ __forceinline__ void codes(const uint4& raw, const Side& s, uint32_t kk, float* q, float& scale,
                                                 float& offset) {
        float sc, mn;
        k4_scale_min(s.hdr, (kk % GROUP) / COLS, sc, mn);
        scale = __fmul_rn(f16_bits(s.hdr.x), sc);
        offset = -__fmul_rn(f16_bits(s.hdr.x >> 16), mn);
        nibbles32_f<0>(raw, q);
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t kk, float* f) {
        float d1, m1;
        codes(raw, s, kk, f, d1, m1);
#pragma unroll
        for (int i = 0; i < 32; i++) f[i] = __fadd_rn(__fmul_rn(d1, f[i]), m1);  // d1 q - dmin m_j
    }
};
// Q5_K: nibble chunks of the low 4 bits; records (48 bytes per 256
// columns): d, dmin, scales[12] as ggml stores them, then per sub-block j
// 4 bytes whose bit b is column 32j + b's fifth bit.
// w = d * sc_j * (q + 16 * bit) - dmin * m_j.
struct FmtQ5K {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_SUPER_BLOCK, SIDE = LAMINA_GGUF_Q5_K_SIDE;
    static constexpr bool SCALED = false, AFFINE = false;
    struct Side {
        uint4 hdr;
        uint32_t qh;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t kk) {
        return {ld_side_u128(rec), ld_side_u32(rec + LAMINA_GGUF_Q4_K_SIDE + 4 * ((kk % GROUP) / COLS))};
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t kk, float* f) {
        float sc, mn;
        k4_scale_min(s.hdr, (kk % GROUP) / COLS, sc, mn);
        const float d1 = __fmul_rn(f16_bits(s.hdr.x), sc), m1 = __fmul_rn(f16_bits(s.hdr.x >> 16), mn);
        uint32_t q[32];
        nibbles32(raw, q);
#pragma unroll
        for (int i = 0; i < 32; i++)
            f[i] = __fsub_rn(__fmul_rn(d1, code_f<0>(q[i] | (((s.qh >> i) & 1u) << 4))), m1);
    }
};
// Int4 (AWQ / GPTQ / compressed-tensors W4A16, checkpoint::int4): nibble
// chunks (the stored codes as they are); records (8 bytes per 32 columns):
// the f32 scale and the zero (as an f32) of the group the chunk lies in,
// repeated for every chunk of a group. w = (q - zero) * scale, the CPU's
// arithmetic. Stored columns are input columns (a checkpoint's column
// order, GPTQ desc_act, goes up widened to bf16 instead).
struct FmtInt4 {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_BLOCK, SIDE = LAMINA_INT4_SIDE;
    static constexpr bool SCALED = false, AFFINE = true;
    struct Side {
        uint2 sz;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t) { return {ld_side_u64(rec)}; }
    // scale sc, offset -(zero * sc)
    static __device__ __forceinline__ void codes(const uint4& raw, const Side& s, uint32_t, float* q, float& scale,
                                                 float& offset) {
        scale = __uint_as_float(s.sz.x);
        offset = -__fmul_rn(__uint_as_float(s.sz.y), scale);
        nibbles32_f<0>(raw, q);
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t, float* f) {
        const float sc = __uint_as_float(s.sz.x), z = __uint_as_float(s.sz.y);
        nibbles32_f<0>(raw, f);
#pragma unroll
        for (int i = 0; i < 32; i++) f[i] = __fmul_rn(__fsub_rn(f[i], z), sc);
    }
};
// Q6_K: nibble chunks of the low 4 bits; records (88 bytes per 256
// columns): per sub-block j of 32 columns 8 bytes of high bits (byte b,
// bits 2i..2i+1: column 32j + b + 8i), then ggml's scales[16] (i8, one per
// 16 columns), d, 6 bytes of padding. w = d * sc * (q - 32).
struct FmtQ6K {
    static constexpr uint32_t COLS = LAMINA_GGUF_NIBBLE_COLS, GROUP = LAMINA_GGUF_SUPER_BLOCK, SIDE = LAMINA_GGUF_Q6_K_SIDE;
    static constexpr bool SCALED = false, AFFINE = false;
    struct Side {
        uint2 qh;
        uint32_t sc;  // the chunk's two i8 scales
        uint32_t d;
    };
    static __device__ __forceinline__ Side side(const unsigned char* rec, uint32_t kk) {
        const uint32_t j = (kk % GROUP) / COLS;
        return {ld_side_u64(rec + 8 * j), ld_side_u16(rec + LAMINA_GGUF_Q6_K_SCALES_AT + 2 * j), ld_side_u16(rec + LAMINA_GGUF_Q6_K_D_AT)};
    }
    static __device__ __forceinline__ void widen(const uint4& raw, const Side& s, uint32_t, float* f) {
        const float d = f16_bits(s.d);
        const float d0 = __fmul_rn(d, code_f<128>((s.sc & 0xFFu) ^ 0x80u));
        const float d1 = __fmul_rn(d, code_f<128>(((s.sc >> 8) & 0xFFu) ^ 0x80u));
        uint32_t q[32];
        nibbles32(raw, q);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const uint32_t b = i % 8, sh = 2 * (i / 8);
            const uint32_t hi = (((b < 4 ? s.qh.x : s.qh.y) >> (8 * (b % 4) + sh)) & 3u);
            f[i] = __fmul_rn(i < 16 ? d0 : d1, code_f<32>(q[i] | (hi << 4)));
        }
    }
};
