// The gated MLP's activations, shared by the unfused kernels
// (activation.cu) and the fused gate/up GEMV's epilogue (gemv.cu):
// SiLU (SwiGLU) and GELU with the tanh approximation (GeGLU), as
// ops::activation computes them.
#pragma once

#include <stdint.h>

#include "lamina_consts.cuh"

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + __expf(-g)); }

__device__ __forceinline__ float gelu_tanh_f(float g) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g)));
}

// The activation of code `act` (LAMINA_ACT_SILU or LAMINA_ACT_GELU_TANH).
__device__ __forceinline__ float gate_act_f(uint32_t act, float g) {
    return act == LAMINA_ACT_GELU_TANH ? gelu_tanh_f(g) : silu_f(g);
}
