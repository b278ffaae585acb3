// The persistent decode kernel: one launch runs a step's layers, op after
// op, where the layered path launches a kernel for each.
//
// persistent_PREFIX_dD_gC: a grid of at most as many blocks of
// LAMINA_PERSIST_THREADS as are resident at once (the host sizes it from
// the occupancy and launches it cooperatively), running `n_ops` ops in
// stream order. Op i is a launch the host recorded instead of making
// (`PersistentOp`: which body, its grid, its argument struct): the same
// body as that kernel (gemv_impl, decode_attention_impl) over the same
// blocks, as virtual blocks v = blockIdx.x, blockIdx.x + gridDim.x, ...
// Ordering, the job of kernel boundaries and PDL in the layered path, is
// done by counters: a virtual block issues its weight loads first (as the
// body does before its PDL wait), then waits until op i - 1's counter
// holds that op's block count (OpSched, sched.cuh; a block waits once an
// op, its later virtual blocks of the op run at once) and runs; once a
// block has run its virtual blocks of op i it counts them in op i's
// counter (one release reduction a block and op: no round trip). So an SM streams
// the next op's weights while the last blocks of the previous op finish
// elsewhere, with no launch, no grid drain and no ramp-up between ops. A
// virtual block that returned before waiting (a decode split with no keys)
// still waits before counting itself, so op i complete means every op
// before it is too. Deadlock-free because every block is resident
// (cooperative launch) and a block only waits for ops before the one it
// runs, which the other resident blocks finish without waiting on it.
// Counters are never reset: launch g (the generation, after the counters
// with the exit count) waits for op i - 1's counter to reach (g + 1) x its
// blocks, modulo 2^32; the last block to exit moves the generation on.
// Intra-op protocols of the bodies (the decode splits' last-block merge)
// need no change: they never wait.
//
// Ops the host may record (everything else runs the layered path): the
// GEMVs of one row (tile m1) of the kernel's weight format without LoRA
// deltas, kinds LAMINA_PERSIST_GEMV_*; decode attention of bf16 caches at
// head size D and group cap C, LAMINA_PERSIST_ATTENTION.
// Registers: capped at 128 a thread (LAMINA_PERSIST_MIN_BLOCKS blocks a
// multiprocessor), what the bodies take alone.
// Trace (PersistentArgs::trace, when not null): thread 0 of each block
// stamps each op's start, the end of its wait and its arrival.
// Shared memory: the bodies' static arrays, the GEMV norm inputs (dynamic,
// the most any op takes) and the current op (double-buffered: the next
// op's record is loaded while this one runs).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "sched.cuh"

static_assert(LAMINA_PERSIST_THREADS == LAMINA_GEMV_WARPS * 32, "persistent blocks run GEMV bodies");
static_assert(LAMINA_PERSIST_THREADS == LAMINA_DECODE_THREADS, "persistent blocks run decode attention bodies");

constexpr uint32_t PERSIST_OP_WORDS = sizeof(PersistentOp) / 4;
static_assert(PERSIST_OP_WORDS <= LAMINA_PERSIST_THREADS, "one word of the next op per thread");
static_assert(sizeof(GemvArgs) <= sizeof(PersistentOp::args) && sizeof(DecodeArgs) <= sizeof(PersistentOp::args),
              "op records hold every argument struct");

// Virtual block v of op `op` (its kind's body), waiting as `s` says.
template <class F, int D, int C>
__device__ __forceinline__ void persistent_run(const PersistentOp& op, uint32_t v, const OpSched& s) {
    const void* args = op.args;
    switch (op.kind) {
        case LAMINA_PERSIST_GEMV_RESID:
            gemv_impl<1, IN_BF16, OUT_RESID, F>(*static_cast<const GemvArgs*>(args), v, s);
            break;
        case LAMINA_PERSIST_GEMV_NORM_GATED:
            gemv_impl<1, IN_NORM, OUT_GATED, F>(*static_cast<const GemvArgs*>(args), v, s);
            break;
        case LAMINA_PERSIST_GEMV_NORM_ROPE:
            gemv_impl<1, IN_NORM, OUT_ROPE, F>(*static_cast<const GemvArgs*>(args), v, s);
            break;
        case LAMINA_PERSIST_ATTENTION: {
            const uint32_t gx = op.grid_x, gy = op.grid_y;
            decode_attention_impl<D, C, bf16>(*static_cast<const DecodeArgs*>(args), v % gx, v / gx % gy,
                                              v / (gx * gy), s);
            break;
        }
        default:
            __trap();  // the host records no other kind
    }
}

// Arrival of `n` virtual blocks at `c` (release: the block's writes, ordered
// before it by the barrier, are visible to whoever acquires the count).
__device__ __forceinline__ void persist_arrive(uint32_t* c, uint32_t n) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(n) : "memory");
}

template <class F, int D, int C>
__device__ __forceinline__ void persistent_impl(const PersistentArgs& p) {
    __shared__ __align__(16) PersistentOp ops[2];
    __shared__ uint32_t waited, launch_gen;
    __shared__ unsigned long long ready_at;
    const uint32_t t = threadIdx.x;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p.ops);
    uint32_t* exits = p.counters + p.n_ops;  // then the generation
    if (t < PERSIST_OP_WORDS) reinterpret_cast<uint32_t*>(&ops[0])[t] = __ldg(src + t);
    if (t == 0) {
        launch_gen = ld_relaxed_u32(exits + 1);
        waited = 0;
    }
    __syncthreads();
    const uint32_t gen = launch_gen;
    for (uint32_t i = 0; i < p.n_ops; i++) {
        const PersistentOp& op = ops[i & 1];
        // The next op's record, in flight while this one runs.
        uint32_t next = 0;
        if (i + 1 < p.n_ops && t < PERSIST_OP_WORDS) next = __ldg(src + (size_t)(i + 1) * PERSIST_OP_WORDS + t);
        // op i - 1 complete: its counter at (gen + 1) x its blocks (mod 2^32)
        const OpSched s{i == 0 ? nullptr : p.counters + (i - 1), i == 0 ? 0u : (gen + 1) * ops[(i + 1) & 1].blocks,
                        &waited, &ready_at};
        const unsigned long long start = p.trace != nullptr ? globaltimer_ns() : 0;
        uint32_t mine = 0;
        for (uint32_t v = blockIdx.x; v < op.blocks; v += gridDim.x, mine++) {
            persistent_run<F, D, C>(op, v, s);
            __syncthreads();
        }
        // (a block that ran nothing, or whose bodies returned before
        // waiting, still waits before counting itself)
        if (t == 0 && !waited) {
            s.spin();
            ready_at = globaltimer_ns();
        }
        // one arrival (and one release) for all of this block's virtual blocks
        if (t == 0 && mine > 0) persist_arrive(p.counters + i, mine);
        if (t == 0 && p.trace != nullptr) {
            unsigned long long* tr = p.trace + ((size_t)i * gridDim.x + blockIdx.x) * 3;  // [n_ops, grid, 3]
            tr[0] = start;
            tr[1] = ready_at;
            tr[2] = globaltimer_ns();
        }
        // ops[(i + 1) & 1] held op i - 1, whose block count `s` has read.
        __syncthreads();
        if (t < PERSIST_OP_WORDS) reinterpret_cast<uint32_t*>(&ops[(i + 1) & 1])[t] = next;
        if (t == 0) waited = 0;
        __syncthreads();
    }
    // The last block out moves the generation on (every block read it
    // before its exit, which the fence orders first).
    if (t == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        if (atomicAdd(exits, 1u) + 1 == gridDim.x) {
            exits[0] = 0;
            exits[1] = gen + 1;
        }
    }
}

#define PERSISTENT_ENTRY(PREFIX, F, D, C)                                                                \
    extern "C" __global__ void __launch_bounds__(LAMINA_PERSIST_THREADS, LAMINA_PERSIST_MIN_BLOCKS)     \
        persistent_##PREFIX##_d##D##_g##C(                                                                \
        const PersistentArgs p) {                                                                         \
        persistent_impl<F, D, C>(p);                                                                      \
    }
PERSISTENT_ENTRY(gemv, FmtBf16, 64, 4)
PERSISTENT_ENTRY(gemv, FmtBf16, 128, 4)
PERSISTENT_ENTRY(gemv, FmtBf16, 256, 4)
PERSISTENT_ENTRY(gemv8, FmtFp8Row, 64, 4)
PERSISTENT_ENTRY(gemv8, FmtFp8Row, 128, 4)
PERSISTENT_ENTRY(gemv8, FmtFp8Row, 256, 4)
