// GGUF block formats widened for the tensor-core path: out[r, c] = the
// weight of row r, column c as the format type (cu/gemv_formats.cuh) widens
// it, rounded to bf16, one [n, k] matrix at a time into the bf16 buffer the
// cuBLAS GEMM then reads. Grid-stride over the format's 16-byte chunks (one
// 16-byte load and COLS / 8 16-byte stores each); k a multiple of the
// format's GROUP. Block LAMINA_ROW_THREADS, at most LAMINA_SILU_MAX_BLOCKS
// blocks. One entry per block format, gguf_dequant_<format> (the prefix of
// `gemv::WeightFormat` without its `gemv_`).
#include "common.cuh"
#include "gemv_formats.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"

template <class F>
__device__ __forceinline__ void gguf_dequant(const GgufDequantArgs& a) {
    const uint32_t per_row = a.k / F::COLS;
    const size_t total = (size_t)a.n * per_row;
    const size_t row_bytes = (size_t)per_row * 16, side_bytes = (size_t)(a.k / F::GROUP) * F::SIDE;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / per_row;
        const uint32_t kk = (uint32_t)(i % per_row) * F::COLS;
        const uint4 raw = *reinterpret_cast<const uint4*>(a.q + r * row_bytes + (size_t)(kk / F::COLS) * 16);
        const typename F::Side s = F::side(a.side + r * side_bytes + (size_t)(kk / F::GROUP) * F::SIDE, kk);
        float f[F::COLS];
        F::widen(raw, s, kk, f);
        uint4* out = reinterpret_cast<uint4*>(a.out + r * a.k + kk);
#pragma unroll
        for (uint32_t h = 0; h < F::COLS; h += 8) {
            uint4 o;
            __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
            for (int e = 0; e < 4; e++) oh[e] = __floats2bfloat162_rn(f[h + 2 * e], f[h + 2 * e + 1]);
            out[h / 8] = o;
        }
    }
}

#define GGUF_DEQUANT(NAME, F) \
    extern "C" __global__ void __launch_bounds__(LAMINA_ROW_THREADS) gguf_dequant_##NAME(const GgufDequantArgs a) { gguf_dequant<F>(a); }
GGUF_DEQUANT(q8_0, FmtQ8_0)
GGUF_DEQUANT(q4_0, FmtQ4_0)
GGUF_DEQUANT(q4_1, FmtQ4_1)
GGUF_DEQUANT(q4_k, FmtQ4K)
GGUF_DEQUANT(q5_k, FmtQ5K)
GGUF_DEQUANT(q6_k, FmtQ6K)
GGUF_DEQUANT(int4, FmtInt4)
