/* The truncation samplers on the host (Model Runner V1 on CPU): typical-p's search for each
 * row's kept interval in four passes (typical_rows_parallel), and the mask of every row's logits
 * outside its interval in one (mask_outside_rows).
 *
 * The math of truncation_math.typical_bounds_on_host, fused: with s = max(l - base, -110)
 * and w = exp(s) (the unnormalized probabilities; base is the top of a sample of the row,
 * so no pass looks for the top itself), c = sum(w * s) / sum(w) is the expected logit
 * (shifted) and d = |s - c| each token's distance from typicality; tokens are kept, nearest
 * first, until their mass first exceeds mass * sum(w). Passes over a row: (1) w, its sums
 * and the range of s; (2) each token's bucket of d (BINS buckets over the row's range of d);
 * (3) the weighted histogram; (4) the tokens of the bucket where the running mass crosses
 * the target, sorted, to find the exact radius.
 *
 * Deterministic and the same on every machine: every sum runs in LANES fixed lanes (the
 * compiler vectorizes them without reassociating), the exp is this file's own polynomial,
 * and the build contracts no products into FMAs (host_kernels.py: -ffp-contract=off; and
 * -fno-trapping-math, without which no loop with a comparison vectorizes).
 * Rows are independent: typical_rows_parallel shares them among OpenMP threads where the
 * build has OpenMP (host_kernels.py tries -fopenmp first).
 * Loaded by processors/host_kernels.py; called by truncation_math (typical_bounds_native,
 * mask_outside_rows_native).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BINS 4096
#define LANES 16
#define CHUNK 1024 /* a multiple of LANES */
#define SAMPLE 64  /* the base logit: the top of every SAMPLE-th */
#define TYPICAL_MARGIN (8 * 1.1920928955078125e-07) /* 8 float32 ulps (truncation_math) */
#define OVER_BASE 64.0f /* weights up to exp(64): 151,936 of them sum far below FLT_MAX */
#define EXP_IS_ZERO 110.0f /* exp(-110) is 0 in float32 under any rounding */

typedef struct {
    float d;
    float w;
} member_t;

/* exp(x) for -110 <= x <= 88: Cephes' expf polynomial (about 1 ulp), 0 below -87. */
static inline float exp_bounded(float x) {
    float y = x < -87.0f ? -87.0f : x;
    float k = floorf(y * 1.44269504088896341f + 0.5f);
    float r = y - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        uint32_t bits;
        float value;
    } scale;
    scale.bits = (uint32_t)((int32_t)k + 127) << 23;
    return x < -87.0f ? 0.0f : p * scale.value;
}

static inline float shifted(float logit, float top) {
    float s = logit - top;
    return s < -EXP_IS_ZERO ? -EXP_IS_ZERO : s; /* -inf (masked) weighs 0 */
}

static int by_distance(const void *a, const void *b) {
    float x = ((const member_t *)a)->d, y = ((const member_t *)b)->d;
    return (x > y) - (x < y);
}

/* The row's top logit (a pass of its own: only where the sample's was no guide). */
static float row_max(const float *l, int64_t n) {
    float most[LANES];
    for (int k = 0; k < LANES; k++) most[k] = -INFINITY;
    int64_t body = n - n % LANES;
    for (int64_t i = 0; i < body; i += LANES)
        for (int k = 0; k < LANES; k++) most[k] = l[i + k] > most[k] ? l[i + k] : most[k];
    float top = -INFINITY;
    for (int k = 0; k < LANES; k++) top = most[k] > top ? most[k] : top;
    for (int64_t i = body; i < n; i++) top = l[i] > top ? l[i] : top;
    return top;
}

/* w = exp(l - base) and its sums over the row; returns the most l - base (0 when base is
 * the top logit). */
static float weigh(const float *l, int64_t n, float base, float *w, double *total_out,
                   double *moment_out, float *lowest_out) {
    int64_t body = n - n % LANES;
    double z[LANES], zs[LANES];
    float least[LANES], most[LANES];
    for (int k = 0; k < LANES; k++) z[k] = zs[k] = 0.0, least[k] = 0.0f, most[k] = -INFINITY;
    for (int64_t start = 0; start < body; start += CHUNK) {
        /* float sums over a chunk (CHUNK / LANES terms a lane), then into double */
        float zc[LANES], zsc[LANES];
        for (int k = 0; k < LANES; k++) zc[k] = zsc[k] = 0.0f;
        int64_t stop = start + CHUNK < body ? start + CHUNK : body;
        for (int64_t i = start; i < stop; i += LANES)
            for (int k = 0; k < LANES; k++) {
                float s = shifted(l[i + k], base);
                float e = exp_bounded(s);
                w[i + k] = e;
                zc[k] += e;
                zsc[k] += e * s;
                least[k] = s < least[k] ? s : least[k];
                most[k] = s > most[k] ? s : most[k];
            }
        for (int k = 0; k < LANES; k++) z[k] += zc[k], zs[k] += zsc[k];
    }
    double total = 0.0, moment = 0.0;
    float lowest = 0.0f, highest = -INFINITY;
    for (int k = 0; k < LANES; k++) {
        total += z[k];
        moment += zs[k];
        lowest = least[k] < lowest ? least[k] : lowest;
        highest = most[k] > highest ? most[k] : highest;
    }
    for (int64_t i = body; i < n; i++) {
        float s = shifted(l[i], base);
        float e = exp_bounded(s);
        w[i] = e;
        total += e;
        moment += (double)e * s;
        lowest = s < lowest ? s : lowest;
        highest = s > highest ? s : highest;
    }
    *total_out = total, *moment_out = moment, *lowest_out = lowest;
    return highest;
}

/* One row: a base logit (its top, or near it), c - base, and the radius of the kept
 * interval around c. */
static void typical_row(float *l, int64_t n, double mass, float *w, uint16_t *bucket,
                        member_t *members, double *hist, float *low_out, float *high_out,
                        int mask) {
    /* The base: the top of every SAMPLE-th logit, so the max needs no pass of its own; the
     * weights are then exp(l - base), up to exp(highest), and every sum is relative to the
     * base (the search needs ratios only). Far above it (an overflow risk), or no finite
     * sample: the row's own top. */
    float base = -INFINITY;
    for (int64_t i = 0; i < n; i += SAMPLE) base = l[i] > base ? l[i] : base;
    if (!(base > -INFINITY)) base = row_max(l, n);
    if (!(base > -INFINITY) || mass >= 1.0) { /* every token masked, or the sampler off */
        *low_out = -INFINITY, *high_out = INFINITY;
        return;
    }
    double total, moment;
    float lowest;
    float highest = weigh(l, n, base, w, &total, &moment, &lowest);
    if (highest > OVER_BASE) {
        base = base + highest;
        highest = weigh(l, n, base, w, &total, &moment, &lowest);
    }
    float c = (float)(moment / total); /* <= highest */
    double width = fmax((double)highest - c, (double)c - lowest);
    width = width < 1e-3 ? 1e-3 : width;
    float scale = (float)(BINS / width);
    double target = mass * total;

    for (int64_t i = 0; i < n; i++) {
        float b = fabsf(shifted(l[i], base) - c) * scale; /* >= 0: the cast truncates = floor */
        bucket[i] = (uint16_t)(b < (float)BINS ? b : (float)BINS);
    }
    memset(hist, 0, (BINS + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) hist[bucket[i]] += w[i];
    double below = 0.0;
    int crossing = BINS;
    for (int b = 0; b <= BINS; b++) {
        if (below + hist[b] > target) {
            crossing = b;
            break;
        }
        below += hist[b];
    }

    int64_t count = 0;
    for (int64_t i = 0; i < n; i += 64) { /* 64 buckets compared at once, mostly no hit */
        int64_t stop = i + 64 < n ? i + 64 : n;
        int hits = 0;
        for (int64_t j = i; j < stop; j++) hits += bucket[j] == crossing;
        if (!hits) continue;
        for (int64_t j = i; j < stop; j++)
            if (bucket[j] == crossing) {
                members[count].d = fabsf(shifted(l[j], base) - c);
                members[count].w = w[j];
                count++;
            }
    }
    qsort(members, (size_t)count, sizeof(member_t), by_distance);
    double radius = (crossing + 1) * width / BINS; /* an empty bucket: never in practice */
    double running = below;
    for (int64_t k = 0; k < count; k++) {
        running += members[k].w;
        radius = members[k].d;
        if (running > target) break; /* the first that passes; rounding: the last */
    }
    /* The kept interval, widened by 8 float32 ulps as truncation_math._typical_interval
     * widens it (so rounding never drops a kept token), then the mask while the row is in
     * cache. */
    double centre = (double)(base + c);
    radius += TYPICAL_MARGIN * (fabs(centre) + radius + 1.0);
    float lo = (float)(centre - radius), hi = (float)(centre + radius);
    *low_out = lo, *high_out = hi;
    if (mask)
        for (int64_t i = 0; i < n; i++) l[i] = (l[i] < lo || l[i] > hi) ? -INFINITY : l[i];
}

/* rows x n logits (row r at logits + r * stride), mass per row: each row's kept interval
 * [low, high], and with mask != 0 every logit outside it set to -inf (row by row, while it
 * is in cache). Work per thread: n floats (w), n uint16 (buckets), n members.
 * The rows are shared among the OpenMP threads of the process: built with
 * -fopenmp, this library uses the OpenMP runtime torch loaded (the same threads, bound to
 * the cores vLLM gave its worker, idle while the logits processors run; a thread of our
 * own would share a core with one of them spinning). At most threads of them (> 0; and
 * never more than the runtime's team). Thread t works in w + t * n, bucket + t * n,
 * members + t * n: a row's result does not depend on which thread ran it. Without OpenMP:
 * one thread. */
void typical_rows_parallel(float *logits, int64_t stride, int64_t rows, int64_t n,
                           const float *mass, float *w, uint16_t *bucket, member_t *members,
                           float *low, float *high, int64_t mask, int64_t threads) {
#ifdef _OPENMP
    int64_t team = omp_get_max_threads();
    team = threads < team ? threads : team;
    team = rows < team ? rows : team;
    team = team < 1 ? 1 : team;
#pragma omp parallel for schedule(dynamic, 1) num_threads((int)team)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = omp_get_thread_num();
        double hist[BINS + 1];
        typical_row(logits + r * stride, n, mass[r], w + t * n, bucket + t * n, members + t * n,
                    hist, low + r, high + r, (int)mask);
    }
#else
    (void)threads;
    double hist[BINS + 1];
    for (int64_t r = 0; r < rows; r++)
        typical_row(logits + r * stride, n, mass[r], w, bucket, members, hist, low + r,
                    high + r, (int)mask);
#endif
}

/* How many threads typical_rows_parallel may use: the OpenMP team (1 without OpenMP). */
int64_t parallel_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Each of count rows (row rows[i] at logits + rows[i] * stride, n logits) keeps low[i] <= x
 * <= high[i]; every other logit becomes -inf. Kept values are not touched. */
void mask_outside_rows(float *logits, int64_t stride, const int64_t *rows, int64_t count,
                       int64_t n, const float *low, const float *high) {
    for (int64_t r = 0; r < count; r++) {
        float *l = logits + rows[r] * stride;
        float lo = low[r], hi = high[r];
        for (int64_t i = 0; i < n; i++) l[i] = (l[i] < lo || l[i] > hi) ? -INFINITY : l[i];
    }
}
