/*
 * toploc CPU kernels: plain C99 + pthreads, no torch or Python headers.
 *
 * Compiled on first use by toploc/native/__init__.py (ctypes; the GIL is released
 * during every call). Every function works on caller-owned buffers, never throws,
 * never touches global thread settings, and returns an error code instead of
 * aborting. Results are identical to the numpy/torch path (tested).
 *
 * P = 65497 is the reference's field prime; products of two residues fit in 32 bits.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define P 65497u
#define ABS_MASK 0x7FFFu
#define NONFINITE 0x7F80u
#define BLOCK 64
#define IDX_BITS 48
#define IDX_MASK ((((uint64_t)1) << IDX_BITS) - 1)

/* x86-64: an AVX2 clone plus the baseline, picked at load time (GCC/Clang ifunc), so the
   library stays portable across machines that share a cache directory */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(TOPLOC_NO_CLONES)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

enum { OK = 0, ERR_NONFINITE = 1, ERR_ARGS = 2, ERR_NOMEM = 3, ERR_NOMODULUS = 4 };

static uint32_t INV[P];
static pthread_once_t INV_ONCE = PTHREAD_ONCE_INIT;

static void init_inverse(void) {
    /* inv(i) = -(P / i) * inv(P mod i) mod P, the standard O(P) recurrence */
    INV[0] = 0;
    INV[1] = 1;
    for (uint32_t i = 2; i < P; i++) {
        INV[i] = (uint32_t)((uint64_t)(P - P / i) * INV[P % i] % P);
    }
}

/* ---------------------------------------------------------------- parallel helper */

typedef void (*chunk_fn)(void *ctx, int64_t first, int64_t last, int *status);

typedef struct {
    chunk_fn fn;
    void *ctx;
    int64_t first, last;
    int status;
} job_t;

static void *run_job(void *arg) {
    job_t *job = (job_t *)arg;
    job->fn(job->ctx, job->first, job->last, &job->status);
    return NULL;
}

/* Split [0, count) over up to `threads` pthreads; returns the first non-zero status. */
static int parallel_for(chunk_fn fn, void *ctx, int64_t count, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (threads > count) threads = (int)(count > 0 ? count : 1);
    job_t jobs[64];
    pthread_t handles[64];
    int started[64] = {0};
    for (int t = 0; t < threads; t++) {
        jobs[t].fn = fn;
        jobs[t].ctx = ctx;
        jobs[t].first = count * t / threads;
        jobs[t].last = count * (t + 1) / threads;
        jobs[t].status = OK;
    }
    for (int t = 1; t < threads; t++) {
        started[t] = pthread_create(&handles[t], NULL, run_job, &jobs[t]) == 0;
        if (!started[t]) run_job(&jobs[t]); /* could not start a thread: do the work here */
    }
    run_job(&jobs[0]);
    int status = OK;
    for (int t = 0; t < threads; t++) {
        if (t > 0 && started[t]) pthread_join(handles[t], NULL);
        if (status == OK) status = jobs[t].status;
    }
    return status;
}

/* ---------------------------------------------------------------- selection */

typedef struct {
    const uint16_t *bits;
    int64_t n, k;
    int64_t *out_idx;
    uint16_t *out_val;
} select_ctx;

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* k-th largest of `count` 15-bit values by a two-level (8 + 7 bit) histogram. */
static uint32_t kth_largest(const uint16_t *values, int64_t count, int64_t k) {
    int64_t high[256] = {0}, low[128] = {0};
    for (int64_t i = 0; i < count; i++) high[values[i] >> 7]++;
    int64_t above = 0;
    int bucket = 255;
    for (; bucket > 0; bucket--) {
        if (above + high[bucket] >= k) break;
        above += high[bucket];
    }
    for (int64_t i = 0; i < count; i++)
        if ((values[i] >> 7) == bucket) low[values[i] & 127]++;
    int rest = 127;
    for (; rest > 0; rest--) {
        if (above + low[rest] >= k) break;
        above += low[rest];
    }
    return ((uint32_t)bucket << 7) | (uint32_t)rest;
}

MULTIVERSION static void select_range(void *arg, int64_t first, int64_t last, int *status) {
    select_ctx *ctx = (select_ctx *)arg;
    const int64_t n = ctx->n, k = ctx->k;
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    uint16_t *block_max = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)blocks);
    uint64_t *cand = NULL;
    int64_t cand_cap = 0;
    if (!block_max) { *status = ERR_NOMEM; return; }
    for (int64_t c = first; c < last && *status == OK; c++) {
        const uint16_t *row = ctx->bits + c * n;
        /* pass 1: block maxima of |value| bits; any Inf/NaN shows up in some block maximum */
        uint32_t worst = 0;
        for (int64_t b = 0; b < blocks; b++) {
            int64_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
            /* int16 after masking: SSE2 has a signed 16-bit max (pmaxsw), so this vectorises */
            int16_t m = 0;
            for (int64_t i = b * BLOCK; i < end; i++) {
                int16_t a = (int16_t)(row[i] & ABS_MASK);
                m = a > m ? a : m;
            }
            block_max[b] = (uint16_t)m;
            worst = m > worst ? m : worst;
        }
        if (worst >= NONFINITE) { *status = ERR_NONFINITE; break; }
        /* the k-th largest block maximum is <= the k-th largest element (k distinct blocks) */
        uint32_t threshold = blocks > k ? kth_largest(block_max, blocks, k) : 0;
        /* pass 2: candidates >= threshold as keys (|v| << 48 | (2^48 - 1 - index)) */
        int64_t count = 0;
        for (int64_t b = 0; b < blocks; b++) {
            if (block_max[b] < threshold) continue;
            int64_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
            for (int64_t i = b * BLOCK; i < end; i++) {
                uint32_t a = row[i] & ABS_MASK;
                if (a < threshold) continue;
                if (count == cand_cap) {
                    int64_t cap = cand_cap ? 2 * cand_cap : 4 * k + 64;
                    uint64_t *grown = (uint64_t *)realloc(cand, sizeof(uint64_t) * (size_t)cap);
                    if (!grown) { *status = ERR_NOMEM; goto done; }
                    cand = grown;
                    cand_cap = cap;
                }
                cand[count++] = ((uint64_t)a << IDX_BITS) | (IDX_MASK - (uint64_t)i);
            }
        }
        qsort(cand, (size_t)count, sizeof(uint64_t), cmp_desc);
        for (int64_t j = 0; j < k; j++) {
            int64_t index = (int64_t)(IDX_MASK - (cand[j] & IDX_MASK));
            ctx->out_idx[c * k + j] = index;
            ctx->out_val[c * k + j] = row[index];
        }
    }
done:
    free(block_max);
    free(cand);
}

/* Top-k of each of C chunks of n bf16 patterns by (|value| desc, index asc). */
int toploc_select(const uint16_t *bits, int64_t C, int64_t n, int64_t k, int64_t *out_idx,
                  uint16_t *out_val, int threads) {
    if (C < 0 || k < 1 || k > n || n >= (int64_t)IDX_MASK) return ERR_ARGS;
    select_ctx ctx = {bits, n, k, out_idx, out_val};
    return parallel_for(select_range, &ctx, C, threads);
}

/* ---------------------------------------------------------------- commitment */

typedef struct {
    const int64_t *idx;
    const uint16_t *val;
    int64_t k;
    int64_t *out_mod, *out_coeffs;
} commit_ctx;

MULTIVERSION static void commit_range(void *arg, int64_t first, int64_t last, int *status) {
    commit_ctx *ctx = (commit_ctx *)arg;
    const int64_t k = ctx->k;
    uint32_t *stamp = (uint32_t *)calloc(P, sizeof(uint32_t));
    uint32_t *work = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(4 * k + 4));
    if (!stamp || !work) { *status = ERR_NOMEM; goto done; }
    /* all residues are < P, and P*P + P < 2^32, so uint32 arithmetic never overflows */
    uint32_t *x = work, *dd = work + k, *coef = work + 2 * k, *next = work + 3 * k;
    uint32_t generation = 0;
    for (int64_t c = first; c < last; c++) {
        const int64_t *idx = ctx->idx + c * k;
        /* modulus: the first m from P down with idx mod m pairwise distinct (stamp marks) */
        uint64_t m = P;
        for (; m >= 1; m--) {
            if (++generation == 0) { memset(stamp, 0, sizeof(uint32_t) * P); generation = 1; }
            int distinct = 1;
            for (int64_t j = 0; j < k; j++) {
                uint64_t r = (uint64_t)idx[j] % m;
                if (stamp[r] == generation) { distinct = 0; break; }
                stamp[r] = generation;
            }
            if (distinct) break;
        }
        if (m == 0) { *status = ERR_NOMODULUS; goto done; }
        for (int64_t j = 0; j < k; j++) {
            x[j] = (uint32_t)((uint64_t)idx[j] % m);
            dd[j] = (uint32_t)(ctx->val[c * k + j] % P);
        }
        /* Newton divided differences: dd[i] <- (dd[i] - dd[i-1]) / (x[i] - x[i-j]), i >= j,
           computed from the previous column into `next`, so the loop has no carried dependency */
        for (int64_t j = 1; j < k; j++) {
            for (int64_t i = j; i < k; i++)
                next[i] = (dd[i] + P - dd[i - 1]) % P * INV[(x[i] + P - x[i - j]) % P] % P;
            memcpy(dd + j, next + j, sizeof(uint32_t) * (size_t)(k - j));
        }
        /* expand d_0 + (x - x_0)(d_1 + (x - x_1)(...)) into ascending monomial coefficients */
        memset(coef, 0, sizeof(uint32_t) * (size_t)k);
        memset(next, 0, sizeof(uint32_t) * (size_t)k); /* both buffers: degree grows into zeros */
        coef[0] = dd[k - 1];
        for (int64_t j = k - 2, degree = 0; j >= 0; j--, degree++) {
            const uint32_t neg = P - x[j];
            next[0] = (dd[j] + neg * coef[0]) % P;
            for (int64_t i = 1; i <= degree + 1; i++) next[i] = (coef[i - 1] + neg * coef[i]) % P;
            uint32_t *swap = coef;
            coef = next;
            next = swap;
        }
        ctx->out_mod[c] = (int64_t)m;
        for (int64_t j = 0; j < k; j++) ctx->out_coeffs[c * k + j] = (int64_t)coef[j];
    }
done:
    free(stamp);
    free(work);
}

/* Modulus search + interpolation for C proofs of k points; values are uint16 patterns. */
int toploc_commit(const int64_t *idx, const uint16_t *val, int64_t C, int64_t k, int64_t *out_mod,
                  int64_t *out_coeffs, int threads) {
    if (C < 0 || k < 1) return ERR_ARGS;
    for (int64_t i = 0; i < C * k; i++)
        if (idx[i] < 0) return ERR_ARGS;
    pthread_once(&INV_ONCE, init_inverse);
    commit_ctx ctx = {idx, val, k, out_mod, out_coeffs};
    return parallel_for(commit_range, &ctx, C, threads);
}

/* ---------------------------------------------------------------- evaluation */

typedef struct {
    const int64_t *coeffs, *idx, *mod;
    int64_t k, n;
    int64_t *out;
} eval_ctx;

MULTIVERSION static void eval_range(void *arg, int64_t first, int64_t last, int *status) {
    eval_ctx *ctx = (eval_ctx *)arg;
    const int64_t n = ctx->n, k = ctx->k;
    uint32_t *work = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(2 * n + 2));
    if (!work) { *status = ERR_NOMEM; return; }
    uint32_t *x = work, *r = work + n;
    for (int64_t c = first; c < last; c++) {
        const int64_t *coef = ctx->coeffs + c * k;
        const uint64_t m = (uint64_t)ctx->mod[c];
        for (int64_t j = 0; j < n; j++) {
            x[j] = (uint32_t)((uint64_t)ctx->idx[c * n + j] % m);
            r[j] = 0;
        }
        /* Horner over all n points at once: r <- r * x + c_i (mod P); r*x + c < 2^32 */
        for (int64_t i = k - 1; i >= 0; i--) {
            const uint32_t ci = (uint32_t)coef[i];
            for (int64_t j = 0; j < n; j++) r[j] = (r[j] * x[j] + ci) % P;
        }
        for (int64_t j = 0; j < n; j++) ctx->out[c * n + j] = (int64_t)r[j];
    }
    free(work);
}

/* out[c, j] = f_c(idx[c, j] mod m_c); coefficients < P, 1 <= m_c <= P (checked by the caller). */
int toploc_evaluate(const int64_t *coeffs, const int64_t *mod, const int64_t *idx, int64_t C, int64_t k,
                    int64_t n, int64_t *out, int threads) {
    if (C < 0 || k < 1 || n < 0) return ERR_ARGS;
    for (int64_t c = 0; c < C; c++)
        if (mod[c] < 1 || mod[c] > (int64_t)P) return ERR_ARGS;
    for (int64_t i = 0; i < C * n; i++)
        if (idx[i] < 0) return ERR_ARGS;
    eval_ctx ctx = {coeffs, idx, mod, k, n, out};
    return parallel_for(eval_range, &ctx, C, threads);
}
