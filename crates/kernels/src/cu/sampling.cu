// Sampling on the GPU, one block of SAMPLE_THREADS threads per sampled row,
// following crates/model/src/sampling.rs step by step:
//  1. logsumexp of the raw logits (reported log-probabilities);
//  2. repetition penalty on a working copy (history ids are distinct);
//  3. temperature 0: argmax, lowest id on ties;
//  4. else p = softmax(z / T); candidates ordered by (p desc, id asc), i.e. by
//     the 64-bit key (bits(p) << 32 | ~id); the kept set is the longest
//     prefix allowed by top_k, top_p (shortest prefix reaching top_p) and
//     min_p, found as a key cut-off by bitwise binary search over the key
//     space (64 passes each, no sort);
//  5. the chosen token is the first kept candidate whose running mass exceeds
//     u * kept mass: the largest key whose prefix mass exceeds that target.
// Prefix masses are deterministic block sums (fixed tree), monotone in the
// cut-off, so a seeded draw is reproducible. The top `n_logprobs` raw
// log-probabilities are found by repeated key-max passes.
// Costs: greedy rows 3 passes over the vocabulary; sampled rows up to ~260.
#include "common.cuh"

#define SAMPLE_THREADS 1024

struct SampleParams {   // mirrors kernels::sampling::SampleParams (12 x 4 bytes)
    float temperature;
    uint32_t top_k;
    float top_p;
    float min_p;
    float rep_penalty;
    float u;
    uint32_t hist_off;
    uint32_t hist_len;
    uint32_t n_logprobs;
    uint32_t pad0, pad1, pad2;
};

__device__ __forceinline__ uint32_t ord_bits(float f) {
    uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ unsigned long long make_key(float f, uint32_t id) {
    return ((unsigned long long)ord_bits(f) << 32) | (unsigned long long)(0xffffffffu - id);
}
__device__ __forceinline__ uint32_t key_id(unsigned long long k) { return 0xffffffffu - (uint32_t)(k & 0xffffffffu); }

// Sum of p over candidates whose key is >= k.
__device__ float mass_ge(const float* p, uint32_t V, unsigned long long k, float* fs) {
    float acc = 0.f;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x)
        if (make_key(p[i], i) >= k) acc += p[i];
    return block_sum(acc, fs);
}
__device__ uint32_t count_ge(const float* p, uint32_t V, unsigned long long k, unsigned* us) {
    uint32_t c = 0;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x)
        if (make_key(p[i], i) >= k) c++;
    return block_sum_u32(c, us);
}
// Key of the n-th candidate (1-based) in key order.
__device__ unsigned long long kth_key(const float* p, uint32_t V, uint32_t n, unsigned* us) {
    unsigned long long k = 0;
    for (int b = 63; b >= 0; b--) {
        unsigned long long c = k | (1ull << b);
        if (count_ge(p, V, c, us) >= n) k = c;
    }
    return k;
}
// Largest key whose prefix mass is >= target (strict = false) or > target (strict = true).
__device__ unsigned long long mass_key(const float* p, uint32_t V, float target, bool strict, float* fs) {
    unsigned long long k = 0;
    for (int b = 63; b >= 0; b--) {
        unsigned long long c = k | (1ull << b);
        float m = mass_ge(p, V, c, fs);
        if (strict ? (m > target) : (m >= target)) k = c;
    }
    return k;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(
    const float* __restrict__ logits,         // [R, V] raw logits
    float* __restrict__ work,                 // [R, V] scratch
    const SampleParams* __restrict__ params,  // [R]
    const uint32_t* __restrict__ history,     // flat, distinct ids per row
    uint32_t V, uint32_t max_lp,
    uint32_t* __restrict__ out_tok,           // [R]
    float* __restrict__ out_lp,               // [R]
    uint32_t* __restrict__ out_top_ids,       // [R, max_lp]
    float* __restrict__ out_top_lp) {         // [R, max_lp]
    __shared__ float fs[32];
    __shared__ unsigned us[32];
    __shared__ unsigned long long ks[32];
    const uint32_t r = blockIdx.x;
    const float* z = logits + (size_t)r * V;
    float* w = work + (size_t)r * V;
    const SampleParams P = params[r];

    float mx = -INFINITY;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, z[i]);
    mx = block_max(mx, fs);
    float se = 0.f;
    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) se += expf(z[i] - mx);
    se = block_sum(se, fs);
    const float lse = mx + logf(se);

    for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) w[i] = z[i];
    __syncthreads();
    if (P.rep_penalty != 1.f) {
        for (uint32_t i = threadIdx.x; i < P.hist_len; i += blockDim.x) {
            uint32_t id = history[P.hist_off + i];
            if (id < V) {
                float v = w[id];
                w[id] = v > 0.f ? v / P.rep_penalty : v * P.rep_penalty;
            }
        }
        __syncthreads();
    }

    uint32_t token;
    if (P.temperature == 0.f) {
        unsigned long long best = 0;
        for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) {
            unsigned long long k = make_key(w[i], i);
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
        for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) w[i] = expf(w[i] - m2) / Z;
        __syncthreads();
        const float pmax = 1.f / Z;
        unsigned long long cut = 0;
        if (P.top_k > 0 && P.top_k < V) {
            unsigned long long k = kth_key(w, V, P.top_k, us);
            cut = k > cut ? k : cut;
        }
        if (P.top_p < 1.f) {
            unsigned long long k = mass_key(w, V, P.top_p, false, fs);
            cut = k > cut ? k : cut;
        }
        if (P.min_p > 0.f) {
            const float thr = P.min_p * pmax;
            uint32_t c = 0;
            for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) c += (w[i] >= thr) ? 1u : 0u;
            c = block_sum_u32(c, us);
            unsigned long long k = kth_key(w, V, c > 0 ? c : 1, us);
            cut = k > cut ? k : cut;
        }
        const float kept = mass_ge(w, V, cut, fs);
        unsigned long long sel = mass_key(w, V, P.u * kept, true, fs);
        sel = sel < cut ? cut : sel;
        token = key_id(sel);
    }
    if (threadIdx.x == 0) {
        out_tok[r] = token;
        out_lp[r] = token < V ? z[token] - lse : -INFINITY;
    }
    unsigned long long prev = ~0ull;
    const uint32_t nlp = min(P.n_logprobs, max_lp);
    for (uint32_t k = 0; k < nlp; k++) {
        unsigned long long best = 0;
        for (uint32_t i = threadIdx.x; i < V; i += blockDim.x) {
            unsigned long long key = make_key(z[i], i);
            if (key < prev && key > best) best = key;
        }
        best = block_max_u64(best, ks);
        if (threadIdx.x == 0) {
            uint32_t id = key_id(best);
            out_top_ids[(size_t)r * max_lp + k] = id;
            out_top_lp[(size_t)r * max_lp + k] = id < V ? z[id] - lse : -INFINITY;
        }
        prev = best;
    }
}
