/* Linear layers (y = x W^T + b) on AVX2/FMA CPUs, fp32 or bf16, over weights laid out once, at load, in panels of 16
   outputs (32 where the build has AVX-512).

   Why: on the 2-vCPU AVX2 box a decode step's GEMMs have a few rows, and oneDNN's packed sgemm read the weights at
   about half the streaming rate there (docs/benchmarks/cpu-runtime.md, "Where a decode step's time goes"); bf16
   weights oneDNN does not pack at all on such a CPU. A panel is the weight's 16 output rows stored input-major,
   [K][16] (row n of the weight is lane n % 16 of panel n / 16; the last panel padded with zero rows), so one pass
   reads each weight exactly once, in order, while 1-6 input rows are multiplied into 12 accumulator registers.

   Two paths:
   - **Up to ROWS rows** (6; 12 with AVX-512: a decode step of few sequences): the rows are read in place and every
     panel streams once, whole (bound by the weights' read). bf16 rows are widened to fp32 first.
   - **More rows** (decode batches, prefill chunks; bound by the FMA units): 192 rows at a time are packed ROWS to a
     k (`pack_rows`, in parallel: the ROWS broadcasts of a k read contiguous bytes; fp32 rows with AVX-512 are read
     in place instead, see chunk_rows), and each thread takes its panels in chunks of about 256 outputs (sizes
     differing by one panel at most): K block by K block (a 40 KB fp32
     slice at most, split evenly), the block's packed rows (~L2) go through every panel of the chunk, summed in an
     fp32 scratch, while the next slice is prefetched a line per k (two for 32-wide fp32; its first rows would
     otherwise wait on memory). On the AVX2 box a slice of 640 (40 KB) outgrew L1, yet ran 1-9% faster than blocks
     of 256 (16 KB, in L1) on every real shape measured, and 1,024 no faster (fewer passes over the scratch; why the
     spill costs so little was not measured). The inner loop is unrolled by four: its counter and pointers cost a
     fifth of the FMA rate otherwise (measured with every operand in L1: 76-81 -> 84-94 GFLOP/s of the core's 95).
   bf16 panels are widened to fp32 as they are read (half the bytes of fp32), sums in fp32, each output rounded once
   to nearest even, as torch's bf16 GEMM.

   With AVX-512 a panel is 32 outputs, a row's two accumulators two zmm registers, and a micro-kernel takes 12 rows
   (24 accumulators of the 32 registers; `kubeinfer_linear_panel` says the width): a 16-wide panel in one register
   would need a broadcast load per FMA, which measured 250-340 GFLOP/s at 512 rows where this did 350-440 with its
   rows packed (2-vCPU AMD EPYC with AVX-512, fp32, SmolLM2's projections; oneDNN 440-470, and 10-50% behind at 1-16
   rows); with fp32 rows in place, 0.90-0.94x oneDNN's rate at 512 rows, in one run of cpu_linear.py. The launcher
   keeps oneDNN for bf16 where oneDNN has a bf16 GEMM (AVX512-BF16, AMX: twice the fp32 rate; kernels/cpu_linear.py).

   Every row runs the same sums in the same order whatever the row count and path (k ascending into one
   accumulator, from the bias; K blocks continue it through fp32 memory): a row's result does not depend on the
   rows beside it. Only where the build has AVX2 and FMA (`kubeinfer_linear_supported`); elsewhere the launcher keeps
   oneDNN. Panels run in parallel under OpenMP (torch's pool). */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <stdlib.h>
#define K_BLOCK (10240 / PANEL)  /* largest K block of the packed path: a 40 KB fp32 slice (640 for 16-wide panels:
                                   measured against 256, 320 and 1,024; 320 for 32-wide, against 640 and 1,536) */
#define M_BLOCK 192     /* rows packed at a time (a K block of them: up to 480 KB, about L2's size) */
#define CHUNK (256 / PANEL)  /* panels a thread takes together (256 outputs): a K block of the packed rows serves
                               all of them */

int kubeinfer_linear_supported(void) { return 1; }

#if defined(__AVX512F__)
/* AVX-512: panels of 32 outputs, two registers a row as AVX2's two of a 16-wide panel, so a k's two weight loads
   and twelve broadcasts feed 24 FMAs, each of 16 products (12 rows measured ahead of 6 at 1-16 rows, even above). */
#define PANEL 32
#define ROWS 12         /* 24 accumulators + 2 weight + 1 input register of the 32 */
#define FP32_IN_PLACE 1 /* fp32 rows read where they are, not packed: see chunk_rows */
typedef __m512 vec;
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_FMA _mm512_fmadd_ps
#define V_SET1 _mm512_set1_ps
#define V_ZERO _mm512_setzero_ps
/* A panel row's 16 weights as fp32: fp32 panels, or bf16 ones widened (a bf16 is the high half of an fp32). */
static inline vec weights_bf16(const void *panel, int64_t i) {
    const __m256i halves = _mm256_loadu_si256((const __m256i *)((const uint16_t *)panel + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
#else
#define PANEL 16
#define ROWS 6          /* input rows a micro-kernel takes at once: 12 accumulators + 2 weight + 1 input register */
#define FP32_IN_PLACE 0
typedef __m256 vec;
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_FMA _mm256_fmadd_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
/* A panel row's 8 weights as fp32: fp32 panels, or bf16 ones widened (a bf16 is the high half of an fp32). */
static inline vec weights_bf16(const void *panel, int64_t i) {
    const __m128i halves = _mm_loadu_si128((const __m128i *)((const uint16_t *)panel + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
#endif
#define HALF (PANEL / 2)   /* a register's lanes: a panel row is two registers */
static inline vec weights_f32(const void *panel, int64_t i) { return V_LOAD((const float *)panel + i); }
#define WEIGHTS(T) const vec w0 = weights_##T(panel, k * PANEL), w1 = weights_##T(panel, k * PANEL + HALF);

/* Accumulators as named variables, not an array: gcc keeps an array of vectors in memory and stores it every step. */
#define DECLARE(r) vec c##r##0, c##r##1;                                                                         \
    if (accumulate) { c##r##0 = V_LOAD(y + r * ldy); c##r##1 = V_LOAD(y + r * ldy + HALF); }                      \
    else { c##r##0 = b0; c##r##1 = b1; }
#define MULTIPLY(r) { const vec a = V_SET1(x[r * ldx + k]);                                                        \
    c##r##0 = V_FMA(a, w0, c##r##0); c##r##1 = V_FMA(a, w1, c##r##1); }
#define MULTIPLY_PACKED(r) { const vec a = V_SET1(x[k * ROWS + r]);                                               \
    c##r##0 = V_FMA(a, w0, c##r##0); c##r##1 = V_FMA(a, w1, c##r##1); }
#define STORE(r) V_STORE(y + r * ldy, c##r##0); V_STORE(y + r * ldy + HALF, c##r##1);
#define BIAS const vec b0 = bias ? V_LOAD(bias) : V_ZERO(), b1 = bias ? V_LOAD(bias + HALF) : V_ZERO();
#define ROWS1(M) M(0)
#define ROWS2(M) ROWS1(M) M(1)
#define ROWS3(M) ROWS2(M) M(2)
#define ROWS4(M) ROWS3(M) M(3)
#define ROWS5(M) ROWS4(M) M(4)
#define ROWS6(M) ROWS5(M) M(5)
#define ROWS7(M) ROWS6(M) M(6)
#define ROWS8(M) ROWS7(M) M(7)
#define ROWS9(M) ROWS8(M) M(8)
#define ROWS10(M) ROWS9(M) M(9)
#define ROWS11(M) ROWS10(M) M(10)
#define ROWS12(M) ROWS11(M) M(11)
int kubeinfer_linear_panel(void) { return PANEL; }
/* y[r][0:PANEL] (+)= bias[0:PANEL] + sum over k < kc of x[r][k] * panel[k][0:PANEL], for r < R; fp32 x, y, bias. */
#define MICRO_KERNEL(R, T)                                                                                        \
static void micro##R##_##T(const float *restrict x, int64_t ldx, const void *restrict panel, int64_t kc,           \
                           const float *restrict bias, float *restrict y, int64_t ldy, int accumulate) {         \
    BIAS ROWS##R(DECLARE)                                                                                         \
    for (int64_t k = 0; k < kc; k++) {                                                                            \
        WEIGHTS(T) ROWS##R(MULTIPLY)                                                                              \
    }                                                                                                             \
    ROWS##R(STORE)                                                                                                \
}
/* The same fetching a line of `next` (NULL: none) per k, over rows packed ROWS to a k (x[k * ROWS + r]: `packed`)
   or in place (x[r * ldx + k]: `strided`, which takes ldx). */
#define FETCHING_KERNEL(NAME, MUL, LDX, R, T)                                                                     \
static void NAME##R##_##T(const float *restrict x, LDX const void *restrict panel, int64_t kc,                    \
                          const float *restrict bias, float *restrict y, int64_t ldy, int accumulate,            \
                          const char *next, int64_t line) {                                                      \
    BIAS ROWS##R(DECLARE)                                                                                         \
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++) {                                                    \
        WEIGHTS(T) ROWS##R(MUL)                                                                                   \
        if (next) { _mm_prefetch(next + k * line, _MM_HINT_T0);                                                   \
                    if (line > 64) _mm_prefetch(next + k * line + 64, _MM_HINT_T0); }                              \
    }                                                                                                             \
    ROWS##R(STORE)                                                                                                \
}
#define PACKED_KERNEL(R, T) FETCHING_KERNEL(packed, MULTIPLY_PACKED, , R, T)
#define LDX_PARAMETER int64_t ldx,
#define STRIDED_KERNEL(R, T) FETCHING_KERNEL(strided, MULTIPLY, LDX_PARAMETER, R, T)
#if ROWS == 12
#define KERNELS(K, T) K(1, T) K(2, T) K(3, T) K(4, T) K(5, T) K(6, T) K(7, T) K(8, T) K(9, T) K(10, T) K(11, T) K(12, T)
#define LIST(P, T) {NULL, P##1_##T, P##2_##T, P##3_##T, P##4_##T, P##5_##T, P##6_##T, P##7_##T, P##8_##T, P##9_##T, \
                    P##10_##T, P##11_##T, P##12_##T}
#else
#define KERNELS(K, T) K(1, T) K(2, T) K(3, T) K(4, T) K(5, T) K(6, T)
#define LIST(P, T) {NULL, P##1_##T, P##2_##T, P##3_##T, P##4_##T, P##5_##T, P##6_##T}
#endif
KERNELS(MICRO_KERNEL, f32)
KERNELS(MICRO_KERNEL, bf16)
KERNELS(PACKED_KERNEL, f32)
KERNELS(PACKED_KERNEL, bf16)
KERNELS(STRIDED_KERNEL, f32)
typedef void (*micro_kernel)(const float *, int64_t, const void *, int64_t, const float *, float *, int64_t, int);
static const micro_kernel MICRO[2][ROWS + 1] = {LIST(micro, f32), LIST(micro, bf16)};
typedef void (*packed_kernel)(const float *, const void *, int64_t, const float *, float *, int64_t, int,
                              const char *, int64_t);
static const packed_kernel PACKED[2][ROWS + 1] = {LIST(packed, f32), LIST(packed, bf16)};
typedef void (*strided_kernel)(const float *, int64_t, const void *, int64_t, const float *, float *, int64_t, int,
                               const char *, int64_t);
static const strided_kernel STRIDED[ROWS + 1] = LIST(strided, f32);

/* The bias of panel p's PANEL columns: in place, or copied into `tail` (zero-padded) for the last, partial panel. */
static const float *panel_bias(const float *bias, int64_t p, int64_t n, float *tail) {
    if (!bias || n - p * PANEL >= PANEL)
        return bias ? bias + p * PANEL : NULL;
    memset(tail, 0, PANEL * sizeof(float));
    memcpy(tail, bias + p * PANEL, (size_t)(n - p * PANEL) * sizeof(float));
    return tail;
}

/* Rows (out of `scratch`, [rows][ldc] fp32) into y's columns [n0, n0 + columns): fp32 copied, bf16 rounded once. */
static void write_out(const float *scratch, int64_t ldc, int64_t rows, int64_t columns, int bf16, void *y,
                      int64_t ldy, int64_t n0) {
    for (int64_t r = 0; r < rows; r++) {
        const float *from = scratch + r * ldc;
        if (bf16) {
            uint16_t *to = (uint16_t *)y + r * ldy + n0;
            for (int64_t c = 0; c < columns; c++) to[c] = f32_to_bf16(from[c]);
        } else {
            memcpy((float *)y + r * ldy + n0, from, (size_t)columns * sizeof(float));
        }
    }
}

/* Up to ROWS fp32 rows x [rows][ldx] through panel p, whole K at once: straight into y (fp32, a whole panel), or
   through a panel-wide scratch when y is bf16 or the panel is the last, partial one (nothing written past y's row). */
static void few_rows(const float *x, int64_t ldx, int64_t rows, int64_t k, const void *panels, int bf16, int64_t p,
                     int64_t n, const float *bias, void *y, int64_t ldy) {
    const void *panel = (const char *)panels + p * k * PANEL * (bf16 ? 2 : 4);
    const int64_t width = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
    float tail[PANEL], scratch[ROWS * PANEL];
    bias = panel_bias(bias, p, n, tail);
    if (!bf16 && width == PANEL) {
        MICRO[0][rows](x, ldx, panel, k, bias, (float *)y + p * PANEL, ldy, 0);
        return;
    }
    MICRO[bf16][rows](x, ldx, panel, k, bias, scratch, PANEL, 0);
    write_out(scratch, PANEL, rows, width, bf16, y, ldy, p * PANEL);
}

/* `rows` rows of x (fp32 or bf16, [rows][ldx]) as fp32 in groups of ROWS, each group k-major: out[g][k][ROWS]
   (the last group's missing rows zero). */
static void pack_rows(const void *x, int64_t ldx, int64_t rows, int64_t k, int bf16, float *out) {
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < (rows + ROWS - 1) / ROWS; g++) {
        float *group = out + g * ROWS * k;
        for (int64_t r = 0; r < ROWS; r++) {
            const int64_t row = g * ROWS + r;
            if (row >= rows) {
                for (int64_t c = 0; c < k; c++) group[c * ROWS + r] = 0.0f;
            } else if (bf16) {
                const uint16_t *from = (const uint16_t *)x + row * ldx;
                for (int64_t c = 0; c < k; c++) group[c * ROWS + r] = bf16_to_f32(from[c]);
            } else {
                const float *from = (const float *)x + row * ldx;
                for (int64_t c = 0; c < k; c++) group[c * ROWS + r] = from[c];
            }
        }
    }
}

/* Panels [p0, p1) for `rows` fp32 rows, K block by K block, summed in `acc` ([rows][(p1 - p0) * PANEL] fp32), then
   written into y. The rows are packed (ldx 0: `pack_rows`'s layout), or read where they are ([rows][ldx]): with
   AVX-512, fp32 rows in place ran 0.99-1.12x the packed ones on every projection of SmolLM2, Qwen2.5-0.5B and
   Llama-3.2-1B at 13-2,048 rows (the packing's pass and barrier cost more than twelve rows' strided broadcasts;
   2-vCPU AMD EPYC, cpu_linear_ab.py, 7 rounds), as long as the next weight slice is fetched ahead (without it, 64
   rows of Llama's gate/up lost 20%). The AVX2 build on that box gained 0-12% the same way; the AVX2 box where the
   packing was chosen was not measured again, so AVX2 keeps it. */
static void chunk_rows(const float *x, int64_t ldx, int64_t rows, int64_t k, const void *panels, int bf16,
                       int64_t p0, int64_t p1, int64_t n, const float *bias, float *acc, void *y, int64_t ldy) {
    const int64_t element = bf16 ? 2 : 4, ldc = (p1 - p0) * PANEL;
    const int64_t blocks = (k + K_BLOCK - 1) / K_BLOCK, k_block = ((k + blocks - 1) / blocks + 7) / 8 * 8;
    float tail[PANEL];
    for (int64_t k0 = 0; k0 < k; k0 += k_block) {
        const int64_t kc = k - k0 < k_block ? k - k0 : k_block;
        for (int64_t p = p0; p < p1; p++) {
            const void *slice = (const char *)panels + (p * k + k0) * PANEL * element;
            const float *b = panel_bias(bias, p, n, tail);
            /* The slice after this one (the next panel's, or the next K block's first), fetched while the first
               rows run here: a k of a slice is a line of fp32 weights (half of one in bf16). */
            const int64_t next_p = p + 1 < p1 ? p + 1 : p0, next_k0 = p + 1 < p1 ? k0 : k0 + k_block;
            const char *next = next_k0 < k ? (const char *)panels + (next_p * k + next_k0) * PANEL * element : NULL;
            for (int64_t r = 0; r < rows; r += ROWS) {
                const int64_t count = rows - r < ROWS ? rows - r : ROWS;
                float *sums = acc + r * ldc + (p - p0) * PANEL;
                if (ldx)   /* fp32 */
                    STRIDED[count](x + r * ldx + k0, ldx, slice, kc, b, sums, ldc, k0 > 0, r == 0 ? next : NULL,
                                   PANEL * element);
                else
                    PACKED[bf16][count](x + r * k + k0 * ROWS, slice, kc, b, sums, ldc, k0 > 0, r == 0 ? next : NULL,
                                        PANEL * element);
            }
        }
    }
    write_out(acc, ldc, rows, (n < p1 * PANEL ? n : p1 * PANEL) - p0 * PANEL, bf16, y, ldy, p0 * PANEL);
}

/* Up to ROWS rows: panels in parallel, each streamed once. */
static int linear_few(const void *x, int64_t ldx, int64_t m, int64_t k, const void *panels, int64_t n,
                      const float *bias, void *y, int64_t ldy, int bf16) {
    float *widened = NULL;   /* bf16 rows as fp32: the micro-kernels read fp32 rows */
    if (bf16) {
        if (!(widened = malloc((size_t)m * (size_t)k * sizeof(float))))
            return -1;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < k; c++)
                widened[r * k + c] = bf16_to_f32(((const uint16_t *)x)[r * ldx + c]);
        x = widened;
        ldx = k;
    }
    const int64_t count = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < count; p++)
        few_rows(x, ldx, m, k, panels, bf16, p, n, bias, y, ldy);
    free(widened);
    return 0;
}

/* y [m][ldy] = x [m][ldx] W^T + bias, W given as ceil(n / 16) panels of [k][16]. x, W and y all fp32, or all bf16
   (bf16 = 1: products summed in fp32 and rounded once, to nearest even, as torch's bf16 GEMM does); bias fp32 or
   NULL. Returns 0, or -1 when a call cannot get its scratch memory. */
int kubeinfer_linear(const void *x, int64_t ldx, int64_t m, int64_t k, const void *panels, int64_t n,
                     const float *bias, void *y, int64_t ldy, int32_t bf16) {
    if (m <= 0)
        return 0;
    if (m <= ROWS)
        return linear_few(x, ldx, m, k, panels, n, bias, y, ldy, bf16);
    /* Chunks of about CHUNK panels, as many for each thread, their sizes differing by one at most. */
    const int64_t count = (n + PANEL - 1) / PANEL, threads = omp_get_max_threads(), element = bf16 ? 2 : 4;
    const int64_t chunks = threads * ((count + threads * CHUNK - 1) / (threads * CHUNK));
    const int64_t chunk = (count + chunks - 1) / chunks;
    const int64_t block_rows = ((m < M_BLOCK ? m : M_BLOCK) + ROWS - 1) / ROWS * ROWS;
    const int in_place = FP32_IN_PLACE && !bf16;
    float *packed = in_place ? NULL : malloc((size_t)block_rows * (size_t)k * sizeof(float));
    float *acc = malloc((size_t)threads * (size_t)block_rows * (size_t)(chunk * PANEL) * sizeof(float));
    if ((!in_place && !packed) || !acc) {
        free(packed);
        free(acc);
        return -1;
    }
    for (int64_t m0 = 0; m0 < m; m0 += M_BLOCK) {
        const int64_t rows = m - m0 < M_BLOCK ? m - m0 : M_BLOCK;
        if (!in_place)
            pack_rows((const char *)x + m0 * ldx * element, ldx, rows, k, bf16, packed);
        const float *from = in_place ? (const float *)x + m0 * ldx : packed;
        void *out = (char *)y + m0 * ldy * element;
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t p0 = c * count / chunks, p1 = (c + 1) * count / chunks;
            if (p0 < p1)
                chunk_rows(from, in_place ? ldx : 0, rows, k, panels, bf16, p0, p1, n, bias,
                           acc + (size_t)omp_get_thread_num() * (size_t)block_rows * (size_t)(chunk * PANEL), out, ldy);
        }
    }
    free(packed);
    free(acc);
    return 0;
}

#else
int kubeinfer_linear_supported(void) { return 0; }
int kubeinfer_linear_panel(void) { return 16; }
int kubeinfer_linear(const void *x, int64_t ldx, int64_t m, int64_t k, const void *panels, int64_t n,
                     const float *bias, void *y, int64_t ldy, int32_t bf16) {
    (void)x; (void)ldx; (void)m; (void)k; (void)panels; (void)n; (void)bias; (void)y; (void)ldy; (void)bf16;
    return -1;
}
#endif
