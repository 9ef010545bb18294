/* Linear layers (y = x W^T + b) on AVX2/FMA CPUs, fp32 or bf16, over weights laid out once, at load, in panels of 16
   outputs.

   Why: on the 2-vCPU AVX2 box a decode step's GEMMs have a few rows, and oneDNN's packed sgemm read the weights at
   about half the streaming rate there (docs/benchmarks/cpu-runtime.md, "Where a decode step's time goes"); bf16
   weights oneDNN
   does not pack at all on such a CPU. A panel is the weight's 16 output rows stored input-major, [K][16] (row n of
   the weight is lane n % 16 of panel n / 16; the last panel padded with zero rows), so one pass reads each weight
   exactly once, in order, while 1-6 input rows are multiplied into 12 accumulator registers. More rows go six at a
   time over a block of K that stays in L1/L2; the same code serves a prefill chunk of 2,048 rows at about oneDNN's
   FLOP rate (benchmarks/cpu_linear.py). bf16 panels are widened to fp32 as they are read (half the bytes of fp32),
   input rows widened once per call, sums in fp32, each output rounded once to nearest even, as torch's bf16 GEMM.

   Every row runs the same sums in the same order whatever the row count (K blocks continue one accumulator): a
   row's result does not depend on the rows beside it. Only where the build has AVX2 and FMA but not AVX-512
   (`kubeinfer_linear_supported`): the one kind of CPU it was measured on; elsewhere the launcher keeps oneDNN.
   Panels run in parallel under OpenMP (torch's pool). */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#include <stdlib.h>
#define PANEL 16
#define ROWS 6          /* input rows a micro-kernel takes at once: 12 accumulators + 2 weight + 1 input register */
#define K_BLOCK 640     /* largest K block (its panel slice, 40 KB, stays in L1/L2 while row blocks pass over it) */
#define M_BLOCK 96      /* input rows per pass over all panels (their K block stays in L2) */

int kubeinfer_linear_supported(void) { return 1; }

/* Eight weights of a panel row as fp32: fp32 panels, or bf16 ones widened (a bf16 is the high half of an fp32). */
static inline __m256 weights_f32(const void *panel, int64_t i) { return _mm256_loadu_ps((const float *)panel + i); }
static inline __m256 weights_bf16(const void *panel, int64_t i) {
    const __m128i halves = _mm_loadu_si128((const __m128i *)((const uint16_t *)panel + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

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
/* y[r][0:16] (+)= bias[0:16] + sum over k < kc of x[r][k] * panel[k][0:16], for r < R; fp32 x, y and bias. */
#define MICRO_KERNEL(R, T)                                                                                        \
static void micro##R##_##T(const float *restrict x, int64_t ldx, const void *restrict panel, int64_t kc,           \
                           const float *restrict bias, float *restrict y, int64_t ldy, int accumulate) {         \
    const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();                                          \
    const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();                                      \
    ROWS##R(DECLARE)                                                                                              \
    for (int64_t k = 0; k < kc; k++) {                                                                            \
        const __m256 w0 = weights_##T(panel, k * PANEL), w1 = weights_##T(panel, k * PANEL + 8);                  \
        ROWS##R(MULTIPLY)                                                                                         \
    }                                                                                                             \
    ROWS##R(STORE)                                                                                                \
}
#define MICRO_KERNELS(T) MICRO_KERNEL(1, T) MICRO_KERNEL(2, T) MICRO_KERNEL(3, T) MICRO_KERNEL(4, T)              \
    MICRO_KERNEL(5, T) MICRO_KERNEL(6, T)
MICRO_KERNELS(f32)
MICRO_KERNELS(bf16)
typedef void (*micro_kernel)(const float *, int64_t, const void *, int64_t, const float *, float *, int64_t, int);
static const micro_kernel MICRO[2][ROWS + 1] = {
    {NULL, micro1_f32, micro2_f32, micro3_f32, micro4_f32, micro5_f32, micro6_f32},
    {NULL, micro1_bf16, micro2_bf16, micro3_bf16, micro4_bf16, micro5_bf16, micro6_bf16},
};

/* fp32 rows x [rows][ldx] through one panel (K block by K block) into fp32 y [rows][ldy], 16 columns. */
static void rows_through_panel(const float *x, int64_t ldx, int64_t rows, int64_t k, const void *panel, int bf16,
                               int64_t k_block, const float *bias, float *y, int64_t ldy) {
    const int64_t element = bf16 ? 2 : 4;
    for (int64_t k0 = 0; k0 < k; k0 += k_block) {
        const int64_t kc = k - k0 < k_block ? k - k0 : k_block;
        const void *slice = (const char *)panel + k0 * PANEL * element;
        for (int64_t r = 0; r < rows; r += ROWS) {
            const int64_t count = rows - r < ROWS ? rows - r : ROWS;
            MICRO[bf16][count](x + r * ldx + k0, ldx, slice, kc, bias, y + r * ldy, ldy, k0 > 0);
        }
    }
}

/* One panel for `rows` fp32 rows of x: straight into y (fp32, a whole panel's 16 columns), or through a 16-column
   scratch when y is bf16 (rounded once, at the end) or the panel is the last, partial one (nothing written past
   y's row). */
static void panel_rows(const float *x, int64_t ldx, int64_t rows, int64_t k, const void *panels, int bf16,
                       int64_t p, int64_t n, int64_t k_block, const float *bias, void *y, int64_t ldy) {
    const void *panel = (const char *)panels + p * k * PANEL * (bf16 ? 2 : 4);
    const int64_t n0 = p * PANEL, width = n - n0 < PANEL ? n - n0 : PANEL;
    float bias_tail[PANEL];
    const float *panel_bias = bias ? bias + n0 : NULL;
    if (bias && width < PANEL) {
        memset(bias_tail, 0, sizeof bias_tail);
        memcpy(bias_tail, bias + n0, (size_t)width * sizeof(float));
        panel_bias = bias_tail;
    }
    if (!bf16 && width == PANEL) {
        rows_through_panel(x, ldx, rows, k, panel, 0, k_block, panel_bias, (float *)y + n0, ldy);
        return;
    }
    float scratch[M_BLOCK * PANEL];
    for (int64_t r0 = 0; r0 < rows; r0 += M_BLOCK) {
        const int64_t count = rows - r0 < M_BLOCK ? rows - r0 : M_BLOCK;
        rows_through_panel(x + r0 * ldx, ldx, count, k, panel, bf16, k_block, panel_bias, scratch, PANEL);
        for (int64_t r = 0; r < count; r++) {
            const float *from = scratch + r * PANEL;
            if (bf16) {
                uint16_t *to = (uint16_t *)y + (r0 + r) * ldy + n0;
                for (int64_t c = 0; c < width; c++) to[c] = f32_to_bf16(from[c]);
            } else {
                memcpy((float *)y + (r0 + r) * ldy + n0, from, (size_t)width * sizeof(float));
            }
        }
    }
}

/* y [m][ldy] = x [m][ldx] W^T + bias, W given as ceil(n / 16) panels of [k][16]. x, W and y all fp32, or all bf16
   (bf16 = 1: products summed in fp32 and rounded once, to nearest even, as torch's bf16 GEMM does); bias fp32 or
   NULL. Returns 0, or -1 when a bf16 call cannot get its scratch memory. */
int kubeinfer_linear(const void *x, int64_t ldx, int64_t m, int64_t k, const void *panels, int64_t n,
                     const float *bias, void *y, int64_t ldy, int32_t bf16) {
    const int64_t count = (n + PANEL - 1) / PANEL, element = bf16 ? 2 : 4;
    const int64_t blocks = (k + K_BLOCK - 1) / K_BLOCK;
    const int64_t k_block = m <= ROWS ? k : ((k + blocks - 1) / blocks + 7) / 8 * 8;   /* K split evenly, 8-aligned */
    if (m <= 0)
        return 0;
    float *widened = NULL;   /* a bf16 row block as fp32: the micro-kernels read fp32 rows */
    if (bf16 && !(widened = malloc((size_t)(m < M_BLOCK ? m : M_BLOCK) * (size_t)k * sizeof(float))))
        return -1;
    for (int64_t m0 = 0; m0 < m; m0 += M_BLOCK) {
        const int64_t rows = m - m0 < M_BLOCK ? m - m0 : M_BLOCK;
        const float *block = (const float *)x + m0 * ldx;
        int64_t block_stride = ldx;
        if (bf16) {
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < k; c++)
                    widened[r * k + c] = bf16_to_f32(((const uint16_t *)x)[(m0 + r) * ldx + c]);
            block_stride = k;
            block = widened;
        }
        void *out = (char *)y + m0 * ldy * element;
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < count; p++)
            panel_rows(block, block_stride, rows, k, panels, bf16, p, n, k_block, bias, out, ldy);
    }
    free(widened);
    return 0;
}

#else
int kubeinfer_linear_supported(void) { return 0; }
int kubeinfer_linear(const void *x, int64_t ldx, int64_t m, int64_t k, const void *panels, int64_t n,
                     const float *bias, void *y, int64_t ldy, int32_t bf16) {
    (void)x; (void)ldx; (void)m; (void)k; (void)panels; (void)n; (void)bias; (void)y; (void)ldy; (void)bf16;
    return -1;
}
#endif
