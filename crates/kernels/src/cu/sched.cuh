// How a kernel body waits for the work before it and reads what that work
// wrote: the one difference between a body run as its own launch and the
// same body run as one op of the persistent decode kernel (cu/persistent.cu).
// Bodies take a `Sched` value and call `wait()` once, uniformly over the
// block, after issuing the loads of data no op of the step writes (weights,
// staged metadata) and before reading anything an earlier op wrote; inputs
// read after it go through `sched_ld16` / `sched_ldf4` / `sched_ldf`.
#pragma once
#include "common.cuh"
#include "pdl.cuh"

// A body launched as its own kernel: programmatic dependent launch orders it
// after the previous kernel, whose outputs are final for the whole launch,
// so they may be read through the read-only data path.
struct LaunchSched {
    static constexpr bool COHERENT = false;
    __device__ __forceinline__ void wait() const {
        pdl_wait();
        pdl_launch_dependents();
    }
};

// The GPU's nanosecond clock, common to every SM.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// A body run as op i of the persistent kernel: it waits until every virtual
// block of op i - 1 has counted itself in `dep` (up to `target`, modulo 2^32,
// counts growing from launch to launch: persistent.cu; the first
// op waits for the previous kernel as a launch does, `dep` null), thread 0
// polling (relaxed loads, then an acquire fence) and the block joining it
// at a barrier, once a block and op. Outputs of earlier ops were written during this launch by
// other SMs, so inputs are read through L2 (`COHERENT`), never the
// non-coherent read-only path. `waited` (shared) records the wait, so that
// a body that returned before waiting still waits before counting itself
// (persistent.cu).
struct OpSched {
    static constexpr bool COHERENT = true;
    const uint32_t* dep;
    uint32_t target;
    uint32_t* waited;
    // (shared) when thread 0 saw the wait end, for the trace (persistent.cu)
    unsigned long long* ready_at;
    // Thread 0's poll (the first op: every thread's PDL wait).
    __device__ __forceinline__ void spin() const {
        if (dep == nullptr) {
            pdl_wait();
        } else if (threadIdx.x == 0) {
            // (a short sleep between polls keeps hundreds of pollers from
            // crowding the counter's L2 slice, where the arrivals land)
            while ((int32_t)(ld_relaxed_u32(dep) - target) < 0) __nanosleep(32);
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
    }
    // Once a virtual block of this op has waited, the block's later ones
    // need not: `waited` is set only after a barrier every thread passed,
    // and read at the next virtual block, after the loop's barrier, so the
    // block agrees on it.
    __device__ __forceinline__ void wait() const {
        if (*waited) return;
        spin();
        if (threadIdx.x == 0) *ready_at = globaltimer_ns();
        __syncthreads();
        if (threadIdx.x == 0) *waited = 1;
    }
};

// 16 bytes of an input an earlier kernel or op wrote.
template <class S>
__device__ __forceinline__ uint4 sched_ld16(const void* p) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    return S::COHERENT ? __ldcg(q) : __ldg(q);
}
template <class S>
__device__ __forceinline__ float4 sched_ldf4(const float* p) {
    const float4* q = reinterpret_cast<const float4*>(p);
    return S::COHERENT ? __ldcg(q) : *q;
}
template <class S>
__device__ __forceinline__ float sched_ldf(const float* p) {
    return S::COHERENT ? __ldcg(p) : *p;
}
