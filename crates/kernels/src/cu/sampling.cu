// Sampling on the GPU following crates/model/src/sampler.rs step by step, in
// two launches:
//  sample_partials: grid (NB = ceil(V / LAMINA_SAMPLE_SLICE), R), LAMINA_SAMPLE_PART_THREADS
//    threads; block b owns ids [b*SLICE, (b+1)*SLICE) of row r and writes
//    (a) its (max, sum exp(z - max)) of the raw logits (for the logsumexp),
//    (b) the repetition penalty applied to its ids (history ids are distinct),
//        then the additive terms (presence / frequency penalties, logit_bias:
//        (id, delta) pairs with distinct ids, merged on the host), the
//        grammar's allowed-token mask (forbidden ids -inf) and, for
//        sampled rows, the penalised logits to `work`,
//    (c) its best key of the penalised logits (greedy: argmax, lowest id on
//        ties) and (d) its top `n_logprobs` keys of the raw logits.
//  sample_rows: grid R, LAMINA_SAMPLE_THREADS threads, per row:
//   1. logsumexp of the raw logits from the NB partials;
//   2. temperature 0: the best of the NB greedy keys;
//   3. else p = softmax(work / T); candidates ordered by (logit desc, id
//      asc), i.e. by the 64-bit key (bits(work / T) << 32 | ~id): the order of
//      p without its f32 ties at huge T (top_k = 1 stays greedy); the kept set is the
//      longest prefix allowed by top_k, top_p (shortest prefix reaching top_p)
//      and min_p, found as a key cut-off by bitwise binary search over the
//      key space (64 passes each, no sort);
//   4. the chosen token is the first kept candidate whose running mass exceeds
//      u * kept mass: the largest key whose prefix mass exceeds that target;
//   5. the top `n_logprobs` raw log-probabilities: repeated key-max passes
//      over the NB * n candidates of the partials.
// Prefix masses are deterministic block sums (fixed tree), monotone in the
// cut-off, so a seeded draw is reproducible. A degenerate row (logits not
// all finite: a non-finite logsumexp; or all equal: sum exp(z - max) = V,
// every term exactly 1) yields token 0 with a NaN log-probability and no
// top log-probabilities: the engine's signal to end that request, never an
// out-of-vocabulary id.
// Costs: greedy rows one read of the logits spread over NB blocks plus a tiny
// merge (a few microseconds at V = 128k); sampled rows add one write of the
// logits and up to ~260 single-block passes (binary searches).
#include "common.cuh"
#include "lamina_args.cuh"
#include "lamina_consts.cuh"
#include "pdl.cuh"

#define SAMPLE_PER_THREAD (LAMINA_SAMPLE_SLICE / LAMINA_SAMPLE_PART_THREADS)

__device__ __forceinline__ uint32_t ord_bits(float f) {
    uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ unsigned long long make_key(float f, uint32_t id) {
    return ((unsigned long long)ord_bits(f) << 32) | (unsigned long long)(0xffffffffu - id);
}
__device__ __forceinline__ uint32_t key_id(unsigned long long k) { return 0xffffffffu - (uint32_t)(k & 0xffffffffu); }

// Candidates are ranked by their scaled logit s (key = (bits(s), ~id)), the
// order of p without the ties p gets in f32 at huge temperatures; masses use
// p = exp(s - m2) / Z, recomputed on the fly from s.
__device__ __forceinline__ float prob_of(float s, float m2, float inv_z) { return expf(s - m2) * inv_z; }

// Sum of p over candidates whose key is >= k.
__device__ float mass_ge(const float* s, uint32_t V, unsigned long long k, float m2, float inv_z, float* fs) {
    float acc = 0.f;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x)
        if (make_key(s[i], i) >= k) acc += prob_of(s[i], m2, inv_z);
    return block_sum(acc, fs);
}
__device__ uint32_t count_ge(const float* s, uint32_t V, unsigned long long k, unsigned* us) {
    uint32_t c = 0;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x)
        if (make_key(s[i], i) >= k) c++;
    return block_sum_u32(c, us);
}
// Key of the n-th candidate (1-based) in key order.
__device__ unsigned long long kth_key(const float* s, uint32_t V, uint32_t n, unsigned* us) {
    unsigned long long k = 0;
    for (int b = 63; b >= 0; b--) {
        unsigned long long c = k | (1ull << b);
        if (count_ge(s, V, c, us) >= n) k = c;
    }
    return k;
}
// Largest key whose prefix mass is >= target (strict = false) or > target (strict = true).
__device__ unsigned long long mass_key(const float* s, uint32_t V, float target, bool strict, float m2, float inv_z,
                                       float* fs) {
    unsigned long long k = 0;
    for (int b = 63; b >= 0; b--) {
        unsigned long long c = k | (1ull << b);
        float m = mass_ge(s, V, c, m2, inv_z, fs);
        if (strict ? (m > target) : (m >= target)) k = c;
    }
    return k;
}

extern "C" __global__ void __launch_bounds__(LAMINA_SAMPLE_PART_THREADS) sample_partials(const SamplePartialArgs a) {
    __shared__ float sv[LAMINA_SAMPLE_SLICE];
    __shared__ float fs[32];
    __shared__ unsigned long long ks[32];
    const uint32_t b = blockIdx.x, r = blockIdx.y;
    pdl_wait();
    pdl_launch_dependents();
    const uint32_t lo = b * LAMINA_SAMPLE_SLICE, hi = min(a.v, lo + LAMINA_SAMPLE_SLICE);
    const float* z = a.logits + (size_t)r * a.v;
    const SampleParams P = a.params[r];
    float zv[SAMPLE_PER_THREAD];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < SAMPLE_PER_THREAD; i++) {
        const uint32_t id = lo + threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS;
        zv[i] = id < hi ? z[id] : -INFINITY;
        sv[threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS] = zv[i];
        mx = fmaxf(mx, zv[i]);
    }
    mx = block_max(mx, fs);
    float se = 0.f;
#pragma unroll
    for (int i = 0; i < SAMPLE_PER_THREAD; i++) se += zv[i] == -INFINITY ? 0.f : expf(zv[i] - mx);
    se = block_sum(se, fs);
    // Repetition penalty on the ids of this slice (history ids are distinct).
    if (P.repetition_penalty != 1.f) {
        for (uint32_t i = threadIdx.x; i < P.hist_len; i += LAMINA_SAMPLE_PART_THREADS) {
            const uint32_t id = a.history[P.hist_off + i];
            if (id >= lo && id < hi) {
                const float v = sv[id - lo];
                sv[id - lo] = v > 0.f ? v / P.repetition_penalty : v * P.repetition_penalty;
            }
        }
    }
    __syncthreads();
    // Additive terms after the repetition penalty (ids distinct: no race).
    if (P.add_len > 0) {
        for (uint32_t i = threadIdx.x; i < P.add_len; i += LAMINA_SAMPLE_PART_THREADS) {
            const uint32_t id = a.history[P.add_off + 2 * i];
            if (id >= lo && id < hi) sv[id - lo] += __uint_as_float(a.history[P.add_off + 2 * i + 1]);
        }
        __syncthreads();
    }
    // The grammar's mask last: forbidden ids (and ids past the mask) become
    // -inf. Each thread masks the entries it reads below: no barrier needed.
    if (P.mask_len > 0) {
#pragma unroll
        for (int i = 0; i < SAMPLE_PER_THREAD; i++) {
            const uint32_t id = lo + threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS;
            const uint32_t word = id / 32;
            const bool allowed = word < P.mask_len && ((a.history[P.mask_off + word] >> (id % 32)) & 1u);
            if (id < hi && !allowed) sv[threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS] = -INFINITY;
        }
    }
    unsigned long long best = 0;
    float* w = a.work + (size_t)r * a.v;
#pragma unroll
    for (int i = 0; i < SAMPLE_PER_THREAD; i++) {
        const uint32_t id = lo + threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS;
        if (id < hi) {
            const float v = sv[threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS];
            if (P.temperature != 0.f) w[id] = v;
            const unsigned long long k = make_key(v, id);
            best = k > best ? k : best;
        }
    }
    best = block_max_u64(best, ks);
    unsigned long long* keys = a.keys + ((size_t)r * a.nb + b) * (1 + a.max_lp);
    if (threadIdx.x == 0) {
        a.stats[((size_t)r * a.nb + b) * 2] = mx;
        a.stats[((size_t)r * a.nb + b) * 2 + 1] = se;
        keys[0] = best;
    }
    // Top raw keys of the slice, largest first (0 = none left).
    const uint32_t nlp = min(P.n_logprobs, a.max_lp);
    unsigned long long prev = ~0ull;
    for (uint32_t k = 0; k < nlp; k++) {
        unsigned long long top = 0;
#pragma unroll
        for (int i = 0; i < SAMPLE_PER_THREAD; i++) {
            const uint32_t id = lo + threadIdx.x + i * LAMINA_SAMPLE_PART_THREADS;
            if (id < hi) {
                const unsigned long long key = make_key(zv[i], id);
                if (key < prev && key > top) top = key;
            }
        }
        top = block_max_u64(top, ks);
        if (threadIdx.x == 0) keys[1 + k] = top;
        prev = top;
    }
}

extern "C" __global__ void __launch_bounds__(LAMINA_SAMPLE_THREADS) sample_rows(const SampleRowsArgs a) {
    __shared__ float fs[32];
    __shared__ unsigned us[32];
    __shared__ unsigned long long ks[32];
    const uint32_t r = blockIdx.x, V = a.v, nb = a.nb, max_lp = a.max_lp;
    pdl_wait();
    pdl_launch_dependents();
    const float* z = a.logits + (size_t)r * V;
    float* w = a.work + (size_t)r * V;
    const SampleParams P = a.params[r];
    const float* st = a.stats + (size_t)r * nb * 2;
    const unsigned long long* kb = a.keys + (size_t)r * nb * (1 + max_lp);

    float mx = -INFINITY;
    for (uint32_t i = threadIdx.x; i < nb; i += blockDim.x) mx = fmaxf(mx, st[2 * i]);
    mx = block_max(mx, fs);
    float se = 0.f;
    for (uint32_t i = threadIdx.x; i < nb; i += blockDim.x) se += st[2 * i + 1] * expf(st[2 * i] - mx);
    se = block_sum(se, fs);
    const float lse = mx + logf(se);

    uint32_t token;
    if (P.temperature == 0.f) {
        unsigned long long best = 0;
        for (uint32_t i = threadIdx.x; i < nb; i += blockDim.x) {
            const unsigned long long k = kb[(size_t)i * (1 + max_lp)];
            best = k > best ? k : best;
        }
        best = block_max_u64(best, ks);
        token = key_id(best);
    } else {
        float m2 = -INFINITY;
        for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) {
            float v = w[i] / P.temperature;
            w[i] = v;
            m2 = fmaxf(m2, v);
        }
        m2 = block_max(m2, fs);
        float Z = 0.f;
        for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) Z += expf(w[i] - m2);
        Z = block_sum(Z, fs);
        __syncthreads();
        // w holds the scaled logits s = z / T: the ranking; p from them
        const float inv_z = 1.f / Z;
        unsigned long long cut = 0;
        if (P.top_k > 0 && P.top_k < V) {
            unsigned long long k = kth_key(w, V, P.top_k, us);
            cut = k > cut ? k : cut;
        }
        if (P.top_p < 1.f) {
            unsigned long long k = mass_key(w, V, P.top_p, false, m2, inv_z, fs);
            cut = k > cut ? k : cut;
        }
        if (P.min_p > 0.f) {
            // p >= min_p * p_max, with p_max = exp(0) / Z
            uint32_t c = 0;
            for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) c += (expf(w[i] - m2) >= P.min_p) ? 1u : 0u;
            c = block_sum_u32(c, us);
            unsigned long long k = kth_key(w, V, c > 0 ? c : 1, us);
            cut = k > cut ? k : cut;
        }
        const float kept = mass_ge(w, V, cut, m2, inv_z, fs);
        unsigned long long sel = mass_key(w, V, P.u * kept, true, m2, inv_z, fs);
        sel = sel < cut ? cut : sel;
        token = key_id(sel);
    }
    // A degenerate row (see the file's head) or no valid draw: report token
    // 0 with a NaN log-probability and no alternatives, the flag the engine
    // ends the request on; never an id outside the vocabulary.
    const bool bad = token >= V || !isfinite(lse) || se >= (float)V;
    if (threadIdx.x == 0) {
        a.out_tok[r] = bad ? 0u : token;
        a.out_lp[r] = bad ? __int_as_float(0x7fc00000) : z[token] - lse;
    }
    // Top raw log-probabilities: key-max passes over the blocks' candidates.
    unsigned long long prev = ~0ull;
    const uint32_t nlp = bad ? 0u : min(P.n_logprobs, max_lp);
    for (uint32_t k = 0; k < nlp; k++) {
        unsigned long long best = 0;
        for (uint32_t e = threadIdx.x; e < nb * nlp; e += blockDim.x) {
            const unsigned long long key = kb[(size_t)(e / nlp) * (1 + max_lp) + 1 + e % nlp];
            if (key < prev && key > best) best = key;
        }
        best = block_max_u64(best, ks);
        if (threadIdx.x == 0) {
            const uint32_t id = key_id(best);
            a.out_top_ids[(size_t)r * max_lp + k] = id;
            a.out_top_lp[(size_t)r * max_lp + k] = id < V ? z[id] - lse : -INFINITY;
        }
        prev = best;
    }
}
