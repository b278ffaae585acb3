// Programmatic dependent launch (sm_90+; no-ops on older targets and when a
// kernel was launched without the attribute). A kernel launched with
// `Gpu::launch_struct_pdl` may start while its predecessor still runs: it
// must call pdl_wait() before reading what the predecessor writes or writing
// what it reads; only reads of data no kernel of the step writes (weights)
// may come before. pdl_launch_dependents() lets the next PDL launch start
// early (its own pdl_wait still waits for this grid to complete).
#pragma once

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Prefetches `bytes` from `p` into L2 (one 128-byte line per call site and lane).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// A 16-byte load of data no kernel of the step writes (weights) that stays
// ahead of a following pdl_wait(): ptxas hoists griddepcontrol.wait above
// ordinary (and .nc) loads, which would turn a prefetch into a load after
// the wait; a relaxed gpu-scope load keeps its place. Not cached in L1.
__device__ __forceinline__ uint4 ld_before_wait(const void* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The 8-byte form of ld_before_wait (FP8 weight chunks).
__device__ __forceinline__ uint2 ld_before_wait8(const void* p) {
    uint2 v;
    asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// The 4-byte form of ld_before_wait (metadata staged before the step's first kernel).
__device__ __forceinline__ uint32_t ld_before_wait_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
