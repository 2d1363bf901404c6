// toploc CUDA kernels: fused top-k selection + modulus search + GF(65497) interpolation
// (prover), and fused selection + polynomial evaluation (verifier). One thread block per
// chunk; no torch headers (launched through a C ABI with raw device pointers and a
// cudaStream_t from ctypes), so nothing is bound to a torch ABI.
//
// Selection is exact and deterministic: a two-level radix select on the 15-bit |value|
// pattern finds the k-th largest value t, then ordered block scans take every element
// above t and the lowest-index elements equal to t. Results equal the CPU path bit for
// bit (same total order (|value| desc, index asc); the interpolating polynomial is unique).
//
// Limits (the Python wrapper falls back to the torch path outside them): k <= 1024,
// chunk size n < 2^31.
#include <cuda_runtime.h>
#include <stdint.h>

#define P 65497u
#define THREADS 256
#define ITEMS 8
#define WARPS (THREADS / 32)
#define MAX_K 1024
#define BITMAP_WORDS ((P + 31) / 32)

enum { FLAG_NONFINITE = 1, FLAG_NO_MODULUS = 2 };

// Exclusive block-wide prefix sum of a non-negative int; every thread of the block must call it.
__device__ int block_scan(int value, int *total, int *warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int v = value;
    for (int offset = 1; offset < 32; offset <<= 1) {  // inclusive scan within the warp
        const int u = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += u;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = lane < WARPS ? warp_sums[lane] : 0;
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, w, offset);
            if (lane >= offset) w += u;
        }
        if (lane < WARPS) warp_sums[lane] = w;  // inclusive sums of warp totals
    }
    __syncthreads();
    const int base = warp ? warp_sums[warp - 1] : 0;
    *total = warp_sums[WARPS - 1];
    __syncthreads();  // warp_sums is reused by the next call
    return base + v - value;
}

// Top-k of one chunk into keys[0..k2) sorted descending, key = |v| << 32 | (2^32 - 1 - index).
// Returns false (uniformly) if the chunk holds NaN/Inf.
__device__ bool select_chunk(const uint16_t *row, int n, int k, int k2, unsigned long long *keys) {
    __shared__ int hist[256];
    __shared__ int warp_sums[WARPS];
    __shared__ int s_bucket, s_above, s_threshold, s_greater, s_nonfinite;
    const int tid = threadIdx.x;
    for (int b = tid; b < 256; b += THREADS) hist[b] = 0;
    if (tid == 0) s_nonfinite = 0;
    __syncthreads();
    for (int i = tid; i < n; i += THREADS) {
        const unsigned a = row[i] & 0x7FFFu;
        if (a >= 0x7F80u) s_nonfinite = 1;
        atomicAdd(&hist[a >> 7], 1);
    }
    __syncthreads();
    if (s_nonfinite) return false;
    if (tid == 0) {
        int above = 0, bucket = 255;
        for (; bucket > 0; bucket--) {
            if (above + hist[bucket] >= k) break;
            above += hist[bucket];
        }
        s_bucket = bucket;
        s_above = above;
    }
    __syncthreads();
    for (int b = tid; b < 128; b += THREADS) hist[b] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += THREADS) {
        const unsigned a = row[i] & 0x7FFFu;
        if ((int)(a >> 7) == s_bucket) atomicAdd(&hist[a & 127u], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int above = s_above, low = 127;
        for (; low > 0; low--) {
            if (above + hist[low] >= k) break;
            above += hist[low];
        }
        s_threshold = (s_bucket << 7) | low;
        s_greater = above;  // elements strictly above the threshold (< k)
    }
    __syncthreads();
    const unsigned threshold = (unsigned)s_threshold;
    const int greater = s_greater, need_equal = k - greater;
    int taken_greater = 0, taken_equal = 0;
    // Ordered collection: each thread owns ITEMS consecutive elements of a tile; one scan of
    // packed counts (greater << 16 | equal; at most THREADS * ITEMS = 2048 per tile) gives
    // every element its rank in index order, so output is deterministic.
    for (int start = 0; start < n; start += THREADS * ITEMS) {  // uniform trip count
        const int first = start + tid * ITEMS;
        int count_greater = 0, count_equal = 0;
        for (int item = 0; item < ITEMS; item++) {
            const int i = first + item;
            if (i < n) {
                const unsigned a = row[i] & 0x7FFFu;
                count_greater += a > threshold;
                count_equal += a == threshold;
            }
        }
        if (!__syncthreads_or(count_greater | count_equal)) continue;  // tile without candidates
        int total;
        const int packed = block_scan((count_greater << 16) | count_equal, &total, warp_sums);
        int pos_greater = taken_greater + (packed >> 16), pos_equal = taken_equal + (packed & 0xFFFF);
        for (int item = 0; item < ITEMS; item++) {
            const int i = first + item;
            if (i >= n) break;
            const unsigned a = row[i] & 0x7FFFu;
            const unsigned long long key = ((unsigned long long)a << 32) | (0xFFFFFFFFull - (unsigned)i);
            if (a > threshold) keys[pos_greater++] = key;
            if (a == threshold) {
                if (pos_equal < need_equal) keys[greater + pos_equal] = key;
                pos_equal++;
            }
        }
        taken_greater += total >> 16;
        taken_equal += total & 0xFFFF;
    }
    for (int j = k + tid; j < k2; j += THREADS) keys[j] = 0ull;  // padding sorts last
    __syncthreads();
    // bitonic sort, descending
    for (int size = 2; size <= k2; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int j = tid; j < k2; j += THREADS) {
                const int partner = j ^ stride;
                if (partner > j) {
                    const bool descending = (j & size) == 0;
                    const unsigned long long x = keys[j], y = keys[partner];
                    if ((x < y) == descending) {
                        keys[j] = y;
                        keys[partner] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
    return true;
}

__device__ __forceinline__ int key_index(unsigned long long key) {
    return (int)(0xFFFFFFFFull - (key & 0xFFFFFFFFull));
}

// Prover: selection, modulus search, Newton interpolation, monomial expansion.
__global__ void select_commit_kernel(const uint16_t *bits, int n, int k, int k2, const uint32_t *inverse,
                                     int64_t *out_idx, int16_t *out_val, int64_t *out_mod, int64_t *out_coeffs,
                                     int32_t *out_flags) {
    extern __shared__ unsigned long long shared[];
    unsigned long long *keys = shared;                    // k2
    uint32_t *x = (uint32_t *)(keys + k2);                // k
    uint32_t *dd = x + k, *next = dd + k, *coef = next + k;
    __shared__ uint32_t bitmap[BITMAP_WORDS];
    __shared__ int s_collision;
    const int c = blockIdx.x, tid = threadIdx.x;
    const uint16_t *row = bits + (size_t)c * n;
    if (!select_chunk(row, n, k, k2, keys)) {
        if (tid == 0) out_flags[c] = FLAG_NONFINITE;
        return;
    }
    for (int j = tid; j < k; j += THREADS) {
        const int index = key_index(keys[j]);
        out_idx[(size_t)c * k + j] = index;
        out_val[(size_t)c * k + j] = (int16_t)row[index];
    }
    // modulus: the first m from P down with all index mod m distinct
    unsigned m = P;
    for (; m >= 1; m--) {
        for (int w = tid; w < BITMAP_WORDS; w += THREADS) bitmap[w] = 0u;
        if (tid == 0) s_collision = 0;
        __syncthreads();
        for (int j = tid; j < k; j += THREADS) {
            const unsigned r = (unsigned)key_index(keys[j]) % m;
            const unsigned bit = 1u << (r & 31u);
            if (atomicOr(&bitmap[r >> 5], bit) & bit) s_collision = 1;
        }
        __syncthreads();
        const int collision = s_collision;
        __syncthreads();
        if (!collision) break;
    }
    if (m == 0) {
        if (tid == 0) out_flags[c] = FLAG_NO_MODULUS;
        return;
    }
    for (int j = tid; j < k; j += THREADS) {
        const int index = key_index(keys[j]);
        x[j] = (unsigned)index % m;
        dd[j] = (uint32_t)row[index] % P;
        coef[j] = 0u;
    }
    __syncthreads();
    for (int j = 1; j < k; j++) {  // Newton divided differences
        for (int i = j + tid; i < k; i += THREADS)
            next[i] = (dd[i] + P - dd[i - 1]) % P * inverse[(x[i] + P - x[i - j]) % P] % P;
        __syncthreads();
        for (int i = j + tid; i < k; i += THREADS) dd[i] = next[i];
        __syncthreads();
    }
    if (tid == 0) coef[0] = dd[k - 1];
    __syncthreads();
    for (int j = k - 2, degree = 0; j >= 0; j--, degree++) {  // c <- c * (x - x_j) + d_j
        const uint32_t neg = P - x[j];
        for (int i = tid; i <= degree + 1; i += THREADS)
            next[i] = ((i ? coef[i - 1] : dd[j]) + neg * coef[i]) % P;
        __syncthreads();
        for (int i = tid; i <= degree + 1; i += THREADS) coef[i] = next[i];
        __syncthreads();
    }
    for (int j = tid; j < k; j += THREADS) out_coeffs[(size_t)c * k + j] = coef[j];
    if (tid == 0) {
        out_mod[c] = m;
        out_flags[c] = 0;
    }
}

// Verifier: selection and f_c(index mod m_c) at the verifier's own top-k.
__global__ void select_evaluate_kernel(const uint16_t *bits, int n, int k, int k2, const int64_t *mod,
                                       const int64_t *coeffs, int64_t *out_idx, int16_t *out_val,
                                       int64_t *out_committed, int32_t *out_flags) {
    extern __shared__ unsigned long long shared[];
    unsigned long long *keys = shared;
    uint32_t *coef = (uint32_t *)(keys + k2);
    const int c = blockIdx.x, tid = threadIdx.x;
    const uint16_t *row = bits + (size_t)c * n;
    if (!select_chunk(row, n, k, k2, keys)) {
        if (tid == 0) out_flags[c] = FLAG_NONFINITE;
        return;
    }
    for (int j = tid; j < k; j += THREADS) coef[j] = (uint32_t)coeffs[(size_t)c * k + j];
    __syncthreads();
    const unsigned m = (unsigned)mod[c];
    for (int j = tid; j < k; j += THREADS) {
        const int index = key_index(keys[j]);
        const uint32_t xj = (unsigned)index % m;
        uint32_t r = 0u;
        for (int i = k - 1; i >= 0; i--) r = (r * xj + coef[i]) % P;
        out_idx[(size_t)c * k + j] = index;
        out_val[(size_t)c * k + j] = (int16_t)row[index];
        out_committed[(size_t)c * k + j] = r;
    }
    if (tid == 0) out_flags[c] = 0;
}

static int next_pow2(int k) {
    int k2 = 1;
    while (k2 < k) k2 <<= 1;
    return k2;
}

extern "C" int toploc_cuda_select_commit(const uint16_t *bits, int64_t chunks, int64_t n, int64_t k,
                                         const uint32_t *inverse, int64_t *out_idx, int16_t *out_val,
                                         int64_t *out_mod, int64_t *out_coeffs, int32_t *out_flags, void *stream) {
    if (chunks < 1 || k < 1 || k > MAX_K || k > n || n >= (1ll << 31)) return 2;
    const int k2 = next_pow2((int)k);
    const size_t shared = sizeof(unsigned long long) * k2 + sizeof(uint32_t) * 4 * k;
    select_commit_kernel<<<(unsigned)chunks, THREADS, shared, (cudaStream_t)stream>>>(
        bits, (int)n, (int)k, k2, inverse, out_idx, out_val, out_mod, out_coeffs, out_flags);
    return cudaGetLastError() == cudaSuccess ? 0 : 3;
}

extern "C" int toploc_cuda_select_evaluate(const uint16_t *bits, int64_t chunks, int64_t n, int64_t k,
                                           const int64_t *mod, const int64_t *coeffs, int64_t *out_idx,
                                           int16_t *out_val, int64_t *out_committed, int32_t *out_flags,
                                           void *stream) {
    if (chunks < 1 || k < 1 || k > MAX_K || k > n || n >= (1ll << 31)) return 2;
    const int k2 = next_pow2((int)k);
    const size_t shared = sizeof(unsigned long long) * k2 + sizeof(uint32_t) * k;
    select_evaluate_kernel<<<(unsigned)chunks, THREADS, shared, (cudaStream_t)stream>>>(
        bits, (int)n, (int)k, k2, mod, coeffs, out_idx, out_val, out_committed, out_flags);
    return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
