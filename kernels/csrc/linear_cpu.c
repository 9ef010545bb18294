/* fp32 linear layers (y = x W^T + b) on AVX2/FMA CPUs, over weights laid out once, at load, in panels of 16 outputs.

   Why: on the 2-vCPU AVX2 box a decode step's GEMMs have a few rows, and oneDNN's packed sgemm read the weights at
   about half the streaming rate there (docs/benchmarks.md, "Where a decode step's time goes"). A panel is the weight's
   16 output rows stored input-major, [K][16] (row n of the weight is lane n % 16 of panel n / 16; the last panel padded
   with zero rows), so one pass reads each weight exactly once, in order, while 1-6 input rows are multiplied into 12
   accumulator registers. More rows go six at a time over a block of K that stays in L1; the same code serves a
   prefill chunk of 2,048 rows at about oneDNN's FLOP rate (benchmarks/cpu_linear.py).

   Scope: fp32 only, and only where the build has AVX2 and FMA but not AVX-512 (`kubeinfer_linear_supported`): the
   one kind of CPU it was measured on. Elsewhere the launcher keeps oneDNN. Panels run in parallel under OpenMP
   (torch's pool). The sums run in another order than MKL's: equal up to rounding. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define PANEL 16
#define ROWS 6          /* input rows a micro-kernel multiplies at once: 12 accumulators + 2 weight + 1 input register */
#define K_BLOCK 640     /* largest K block (its panel slice, 40 KB, stays in L1/L2 while row blocks pass over it) */
#define M_BLOCK 96      /* input rows per pass over all panels (their K block stays in L2) */

int kubeinfer_linear_supported(void) { return 1; }

/* Accumulators as named variables, not an array: gcc keeps an array of __m256 in memory and stores it every step. */
#define DECLARE(r) __m256 c##r##0, c##r##1;                                                                      \
    if (accumulate) { c##r##0 = _mm256_loadu_ps(y + r * ldy); c##r##1 = _mm256_loadu_ps(y + r * ldy + 8); }      \
    else { c##r##0 = b0; c##r##1 = b1; }
#define MULTIPLY(r) { const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);                                       \
    c##r##0 = _mm256_fmadd_ps(a, w0, c##r##0); c##r##1 = _mm256_fmadd_ps(a, w1, c##r##1); }
#define STORE(r) _mm256_storeu_ps(y + r * ldy, c##r##0); _mm256_storeu_ps(y + r * ldy + 8, c##r##1);
#define ROWS1(M) M(0)
#define ROWS2(M) ROWS1(M) M(1)
#define ROWS3(M) ROWS2(M) M(2)
#define ROWS4(M) ROWS3(M) M(3)
#define ROWS5(M) ROWS4(M) M(4)
#define ROWS6(M) ROWS5(M) M(5)
/* y[r][0:16] (+)= bias[0:16] + sum over k < kc of x[r][k] * panel[k][0:16], for r < R. */
#define MICRO_KERNEL(R)                                                                                           \
static inline void micro##R(const float *restrict x, int64_t ldx, const float *restrict panel, int64_t kc,          \
                            const float *restrict bias, float *restrict y, int64_t ldy, int accumulate) {        \
    const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();                                          \
    const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();                                      \
    ROWS##R(DECLARE)                                                                                              \
    for (int64_t k = 0; k < kc; k++) {                                                                            \
        const __m256 w0 = _mm256_loadu_ps(panel + k * PANEL), w1 = _mm256_loadu_ps(panel + k * PANEL + 8);        \
        ROWS##R(MULTIPLY)                                                                                         \
    }                                                                                                             \
    ROWS##R(STORE)                                                                                                \
}
MICRO_KERNEL(1) MICRO_KERNEL(2) MICRO_KERNEL(3) MICRO_KERNEL(4) MICRO_KERNEL(5) MICRO_KERNEL(6)

/* rows x [rows][ldx] through one panel's K block into y [rows][ldy] (16 columns). */
static void rows_through_panel(const float *x, int64_t ldx, int64_t rows, const float *panel, int64_t kc,
                               const float *bias, float *y, int64_t ldy, int accumulate) {
    int64_t r = 0;
    for (; r + ROWS <= rows; r += ROWS)
        micro6(x + r * ldx, ldx, panel, kc, bias, y + r * ldy, ldy, accumulate);
    const float *xr = x + r * ldx;
    float *yr = y + r * ldy;
    switch (rows - r) {
        case 1: micro1(xr, ldx, panel, kc, bias, yr, ldy, accumulate); break;
        case 2: micro2(xr, ldx, panel, kc, bias, yr, ldy, accumulate); break;
        case 3: micro3(xr, ldx, panel, kc, bias, yr, ldy, accumulate); break;
        case 4: micro4(xr, ldx, panel, kc, bias, yr, ldy, accumulate); break;
        case 5: micro5(xr, ldx, panel, kc, bias, yr, ldy, accumulate); break;
        default: break;
    }
}

/* One panel for rows [m0, m0 + rows) over all of K, K block by K block. The last panel, when n is not a multiple
   of 16, goes through a 16-column scratch so that nothing past y's row is written. */
static void panel_rows(const float *x, int64_t ldx, int64_t m0, int64_t rows, int64_t k, const float *panels,
                       int64_t p, int64_t n, const float *bias, float *y, int64_t ldy, int64_t k_block) {
    const float *panel = panels + p * k * PANEL;
    const int64_t n0 = p * PANEL, width = n - n0 < PANEL ? n - n0 : PANEL;
    float bias_tail[PANEL];
    const float *panel_bias = bias ? bias + n0 : NULL;
    if (bias && width < PANEL) {
        memset(bias_tail, 0, sizeof bias_tail);
        memcpy(bias_tail, bias + n0, (size_t)width * sizeof(float));
        panel_bias = bias_tail;
    }
    if (width == PANEL) {
        for (int64_t k0 = 0; k0 < k; k0 += k_block)
            rows_through_panel(x + m0 * ldx + k0, ldx, rows, panel + k0 * PANEL, k - k0 < k_block ? k - k0 : k_block,
                               panel_bias, y + m0 * ldy + n0, ldy, k0 > 0);
        return;
    }
    float scratch[ROWS * PANEL];
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int64_t count = rows - r0 < ROWS ? rows - r0 : ROWS;
        for (int64_t k0 = 0; k0 < k; k0 += k_block)
            rows_through_panel(x + (m0 + r0) * ldx + k0, ldx, count, panel + k0 * PANEL,
                               k - k0 < k_block ? k - k0 : k_block, panel_bias, scratch, PANEL, k0 > 0);
        for (int64_t r = 0; r < count; r++)
            memcpy(y + (m0 + r0 + r) * ldy + n0, scratch + r * PANEL, (size_t)width * sizeof(float));
    }
}

/* y [m][ldy] = x [m][ldx] W^T + bias, W given as ceil(n / 16) panels of [k][16]; bias may be NULL. */
int kubeinfer_linear(const float *x, int64_t ldx, int64_t m, int64_t k, const float *panels, int64_t n,
                     const float *bias, float *y, int64_t ldy) {
    const int64_t count = (n + PANEL - 1) / PANEL;
    const int64_t blocks = (k + K_BLOCK - 1) / K_BLOCK;
    const int64_t k_block = ((k + blocks - 1) / blocks + 7) / 8 * 8;   /* K split evenly, 8-aligned */
    if (m <= ROWS) {   /* a decode step: one pass over the weights, panels in parallel */
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < count; p++)
            panel_rows(x, ldx, 0, m, k, panels, p, n, bias, y, ldy, k);
        return 0;
    }
    for (int64_t m0 = 0; m0 < m; m0 += M_BLOCK) {
        const int64_t rows = m - m0 < M_BLOCK ? m - m0 : M_BLOCK;
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < count; p++)
            panel_rows(x, ldx, m0, rows, k, panels, p, n, bias, y, ldy, k_block);
    }
    return 0;
}

#else
int kubeinfer_linear_supported(void) { return 0; }
int kubeinfer_linear(const float *x, int64_t ldx, int64_t m, int64_t k, const float *panels, int64_t n,
                     const float *bias, float *y, int64_t ldy) {
    (void)x; (void)ldx; (void)m; (void)k; (void)panels; (void)n; (void)bias; (void)y; (void)ldy;
    return -1;
}
#endif
