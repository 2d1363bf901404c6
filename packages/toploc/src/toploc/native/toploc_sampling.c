/* toploc's seeded Gumbel-max draw (toploc/sampling.py) fused into one pass per row.
 *
 * Per row b and vocabulary entry v, with every + and * wrapping modulo 2^64:
 *   key = mix(mix(mix(mix(seed + G) + seq[b] * G) + pos[b] * G)
 *   u   = (double)(mix(key + (v + 1) * G) >> 11) + 0.5) * 2^-53
 *   s_v = (double)logits[b, v] + T * -log(-log(u))          (T = 0: s_v = logits[b, v])
 * and out[b] = argmax_v s_v (first index on ties). This is the reference's formula op for op,
 * so the hash and u are bit-identical; log comes from the C library here and from torch's
 * vectorised log there, which may differ in the last bit. Hence a row is reported ambiguous
 * (and redrawn by the reference) when its runner-up score lies within `margin` of the best, or
 * when a logit is NaN or +inf: outside those rows the argmax cannot depend on the last bit.
 *
 * Compiled with -ffp-contract=off (no fused multiply-add: each operation rounds as in torch).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#define GAMMA 0x9E3779B97F4A7C15ULL

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct {
    const float *logits;
    int64_t rows, vocab, next;
    uint64_t seed;
    const int64_t *seq, *pos;
    double temperature, margin;
    int64_t *out;
    uint8_t *ambiguous;
    pthread_mutex_t lock;
} draw_job;

static inline double exact_score(double x, uint64_t key, int64_t v, double t) {
    uint64_t bits = mix(key + (uint64_t)(v + 1) * GAMMA) >> 11;
    double u = ((double)bits + 0.5) * 0x1p-53;
    return x + t * -log(-log(u));
}

/* An upper bound of -log(-log(u)) from integers only, without a log: with k = 2^53 - bits >= 1
 * and L = floor(log2 k), 1 - u >= (k - 1/2) / 2^53 >= 2^(L - 54), and -log(u) >= 1 - u, so
 * -log(-log(u)) <= -log(1 - u) <= (54 - L) ln 2. It exceeds the noise by ~1.4 at most, so only
 * a handful of entries per row come within reach of the best score and need the two logs. */
static inline double noise_bound(uint64_t key, int64_t v) {
    uint64_t bits = mix(key + (uint64_t)(v + 1) * GAMMA) >> 11;
    uint64_t k = (1ULL << 53) - bits;
    return (double)(54 - (63 - __builtin_clzll(k))) * 0.69314718055994531;
}

static void draw_row(const draw_job *job, int64_t b) {
    const float *x = job->logits + b * job->vocab;
    const double t = job->temperature;
    const int64_t n = job->vocab;
    uint64_t key = mix(mix(mix(job->seed + GAMMA) + (uint64_t)job->seq[b] * GAMMA) + (uint64_t)job->pos[b] * GAMMA);
    double best = -INFINITY, second = -INFINITY;
    int64_t best_index = 0;
    if (t == 0.0) {
        for (int64_t v = 0; v < n; v++) {
            double s = (double)x[v];
            if (isnan(s) || s == INFINITY) goto refuse;
            if (s > best) { second = best; best = s; best_index = v; }
            else if (s > second) second = s;
        }
    } else {
        /* Pass 1 (no hashing): the largest logit's exact score seeds the best score. */
        int64_t seed_index = 0;
        for (int64_t v = 0; v < n; v++) {
            if (isnan(x[v]) || x[v] == INFINITY) goto refuse;
            if (x[v] > x[seed_index]) seed_index = v;
        }
        double floor_score = exact_score((double)x[seed_index], key, seed_index, t);
        /* Pass 2: exact scores only where the bound (plus rounding slack) reaches within the
         * ambiguity margin of a score already seen; the rest can be neither best nor runner-up
         * within the margin. Visiting in index order keeps the reference's first-index ties. */
        for (int64_t v = 0; v < n; v++) {
            double xv = (double)x[v];
            double bound = xv + t * noise_bound(key, v);
            double reach = bound + 1e-6 * (1.0 + fabs(xv) + t * 64.0);
            double cut = (best > floor_score ? best : floor_score);
            if (reach < cut - job->margin * (1.0 + fabs(cut))) continue;
            double s = exact_score(xv, key, v, t);
            if (s > best) { second = best; best = s; best_index = v; }
            else if (s > second) second = s;
        }
    }
    job->out[b] = best_index;
    /* also catches an exact tie (best == second), whose winner is the first index in both */
    job->ambiguous[b] = n == 0 || best == -INFINITY || best - second <= job->margin * (1.0 + fabs(best));
    return;
refuse: /* NaN or +inf logits: the reference decides */
    job->out[b] = 0;
    job->ambiguous[b] = 1;
}

static void *draw_worker(void *arg) {
    draw_job *job = arg;
    for (;;) {
        pthread_mutex_lock(&job->lock);
        int64_t b = job->next++;
        pthread_mutex_unlock(&job->lock);
        if (b >= job->rows) return NULL;
        draw_row(job, b);
    }
}

/* Returns 0, or 2 for invalid arguments. */
int toploc_gumbel_argmax(const float *logits, int64_t rows, int64_t vocab, uint64_t seed, const int64_t *seq,
                         const int64_t *pos, double temperature, double margin, int64_t *out, uint8_t *ambiguous,
                         int threads) {
    if (rows < 0 || vocab < 0 || !(temperature >= 0.0) || threads < 1) return 2;
    draw_job job = {logits, rows, vocab, 0, seed, seq, pos, temperature, margin, out, ambiguous,
                    PTHREAD_MUTEX_INITIALIZER};
    if (threads > rows) threads = rows > 0 ? (int)rows : 1;
    pthread_t ids[64];
    if (threads > 64) threads = 64;
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&ids[started], NULL, draw_worker, &job) != 0) break;
        started++;
    }
    draw_worker(&job);
    for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
    return 0;
}
