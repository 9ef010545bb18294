/* The per-token ops around the GEMMs, on the CPU, each in one pass over its rows: RMSNorm (with the residual add),
   rotary embedding of q and k, and SiLU-and-mul. PyTorch runs each as five to ten whole-tensor passes (pow, mean,
   rsqrt, mul, cat...), which at prefill sizes stream megabytes through memory per pass. And the greedy token (argmax)
   of a step's logits, which torch reads at a third of the memory's rate.

   Scope: fp32 and bf16 tensors (all of one call in one dtype). bf16 computes in fp32 and rounds (to nearest even)
   where the PyTorch reference rounds: after each op the reference runs in bf16, so that both agree to the bit but
   for summation order. Rows are addressed by two strides (outer, inner), so a view [tokens, heads, D] split out of
   a fused QKV projection needs no copy; the last dimension is contiguous. Outputs are new contiguous tensors:
   inputs are never written. Rows run in parallel under OpenMP (the process's pool: torch's libgomp) when there are
   enough of them to pay for the fork. The reference of each is in kubeinfer/kernels/references.py. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "bf16.h"

#define PARALLEL_MIN_ELEMENTS 16384   /* below this, one thread: a decode step's few rows */
#define INLINE static inline __attribute__((always_inline))

/* Element i of a row of the call's dtype (bf16 = 1: uint16 storage), as fp32; and back. */
INLINE float load(const void *row, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

INLINE void store(void *row, int64_t i, float value, int bf16) {
    if (bf16) ((uint16_t *)row)[i] = f32_to_bf16(value);
    else ((float *)row)[i] = value;
}

/* What a bf16 op's result is: the fp32 value rounded to bf16 (fp32: itself). */
INLINE float rounded(float value, int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(value)) : value; }

INLINE const char *row_at(const char *base, int64_t row, int64_t inner, int64_t outer_stride, int64_t inner_stride,
                          int64_t size) {
    return base + ((row / inner) * outer_stride + (row % inner) * inner_stride) * size;
}

/* out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps) over rows = outer * inner rows of `cols`.
   With `residual` (rows of `cols`, contiguous): x + residual is normalised, and written to `residual_out`. */
INLINE void rms_norm(const void *x, int64_t outer, int64_t inner, int64_t outer_stride, int64_t inner_stride,
                     const void *residual, const void *weight, int64_t cols, float eps, void *out,
                     void *residual_out, int bf16) {
    const int64_t rows = outer * inner, size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const char *src = row_at(x, r, inner, outer_stride, inner_stride, size);
        char *dst = (char *)out + r * cols * size;
        float sum = 0.0f;
        if (residual) {
            const char *add = (const char *)residual + r * cols * size;
            char *keep = (char *)residual_out + r * cols * size;
            for (int64_t c = 0; c < cols; c++) {
                const float v = rounded(load(src, c, bf16) + load(add, c, bf16), bf16);
                store(keep, c, v, bf16);
                sum += v * v;
            }
            src = keep;
        } else {
            for (int64_t c = 0; c < cols; c++) {
                const float v = load(src, c, bf16);
                sum += v * v;
            }
        }
        const float inv = 1.0f / sqrtf(sum / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++)   /* normed in fp32, rounded to the dtype, then times the weight */
            store(dst, c, load(weight, c, bf16) * rounded(load(src, c, bf16) * inv, bf16), bf16);
    }
}

int kubeinfer_rms_norm(const void *x, int64_t outer, int64_t inner, int64_t outer_stride, int64_t inner_stride,
                       const void *residual, const void *weight, int64_t cols, float eps, void *out,
                       void *residual_out, int32_t bf16) {
    if (bf16) rms_norm(x, outer, inner, outer_stride, inner_stride, residual, weight, cols, eps, out, residual_out, 1);
    else rms_norm(x, outer, inner, outer_stride, inner_stride, residual, weight, cols, eps, out, residual_out, 0);
    return 0;
}

/* Rotary embedding, NeoX layout (rotate halves), of `heads` heads of size d per token: token t's head h sits at
   x + t * token_stride + h * d (elements). cos_sin: fp32 [max_positions, d], cos in the first half, sin in the
   second; in bf16 they are rounded to bf16 first, as the reference casts them to q's dtype. */
INLINE void rotate(const void *x, int64_t token_stride, const int64_t *positions, const float *cos_sin,
                   int64_t tokens, int64_t heads, int64_t d, void *out, int bf16) {
    const int64_t half = d / 2, size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cosines = cos_sin + positions[t] * d;
        const float *sines = cosines + half;
        for (int64_t h = 0; h < heads; h++) {
            const char *src = (const char *)x + (t * token_stride + h * d) * size;
            char *dst = (char *)out + (t * heads + h) * d * size;
            if (!bf16) {   /* typed rows that cannot alias: the loop vectorises (3x at 2,040 tokens, 1.5x at 16) */
                const float *restrict in = (const float *)src;
                float *restrict to = (float *)dst;
                for (int64_t i = 0; i < half; i++) {
                    to[i] = in[i] * cosines[i] - in[half + i] * sines[i];
                    to[half + i] = in[half + i] * cosines[i] + in[i] * sines[i];
                }
                continue;
            }
            for (int64_t i = 0; i < half; i++) {
                const float x1 = load(src, i, bf16), x2 = load(src, half + i, bf16);
                const float c = rounded(cosines[i], bf16), s = rounded(sines[i], bf16);
                store(dst, i, rounded(x1 * c, bf16) - rounded(x2 * s, bf16), bf16);
                store(dst, half + i, rounded(x2 * c, bf16) + rounded(x1 * s, bf16), bf16);
            }
        }
    }
}

int kubeinfer_rotary(const int64_t *positions, int64_t tokens, const void *q, int64_t q_stride, int64_t q_heads,
                     const void *k, int64_t k_stride, int64_t k_heads, int64_t d, const float *cos_sin, void *q_out,
                     void *k_out, int32_t bf16) {
    if (d % 2)
        return 1;
    if (bf16) {
        rotate(q, q_stride, positions, cos_sin, tokens, q_heads, d, q_out, 1);
        rotate(k, k_stride, positions, cos_sin, tokens, k_heads, d, k_out, 1);
    } else {
        rotate(q, q_stride, positions, cos_sin, tokens, q_heads, d, q_out, 0);
        rotate(k, k_stride, positions, cos_sin, tokens, k_heads, d, k_out, 0);
    }
    return 0;
}

/* out[r] = silu(x[r, :d]) * x[r, d:] for rows of 2d at x + r * row_stride (elements). The exponent is capped so
   that it stays finite (the build assumes no infinities): silu(g) for g < -80 is then g * 1.8e-35, not -0. */
INLINE void silu_and_mul(const void *x, int64_t rows, int64_t row_stride, int64_t d, void *out, int bf16) {
    const int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * d >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const char *gate = (const char *)x + r * row_stride * size, *up = gate + d * size;
        char *dst = (char *)out + r * d * size;
        for (int64_t c = 0; c < d; c++) {
            const float g = load(gate, c, bf16);
            store(dst, c, rounded(g / (1.0f + expf(fminf(-g, 80.0f))), bf16) * load(up, c, bf16), bf16);
        }
    }
}

int kubeinfer_silu_and_mul(const void *x, int64_t rows, int64_t row_stride, int64_t d, void *out, int32_t bf16) {
    if (bf16) silu_and_mul(x, rows, row_stride, d, out, 1);
    else silu_and_mul(x, rows, row_stride, d, out, 0);
    return 0;
}

/* The paged K/V cache write: token t's K row (and V row), `row` elements of every KV head at key + t * key_stride
   (value + t * value_stride), copied to slot slots[t] of the caches (contiguous, `row` elements a slot); a token
   whose slot is negative (padding) is skipped. The caches hold the rows' own dtype (`size` bytes an element): a
   plain copy, as the reference's index_copy_. */
int kubeinfer_store_kv(const void *key, int64_t key_stride, const void *value, int64_t value_stride, void *k_cache,
                       void *v_cache, const int64_t *slots, int64_t tokens, int64_t row, int64_t size) {
    const int64_t bytes = row * size;
#pragma omp parallel for schedule(static) if (tokens * row >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        memcpy((char *)k_cache + slot * bytes, (const char *)key + t * key_stride * size, bytes);
        memcpy((char *)v_cache + slot * bytes, (const char *)value + t * value_stride * size, bytes);
    }
    return 0;
}

/* NaN tests on the bits (the library is built with -ffast-math, under which a float comparison may assume none). */
INLINE int is_nan(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

static int64_t first_nan(const float *row, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (is_nan(row[i])) return i;
    return -1;
}

/* The first index of the row's largest value, as torch.argmax (a NaN is the largest: the first NaN's index). One
   pass: each of 8 lanes keeps its largest value and that value's first index (only a strictly greater value
   replaces it), then the lanes' largest wins, at the lowest index among equals; the tail goes one by one. */
static int64_t row_argmax(const float *row, int64_t n) {
    int64_t i = 0, best_index = 0;
    float best = row[0];
#if defined(__AVX2__)
    if (n >= 8) {
        const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), infinity = _mm256_set1_epi32(0x7f800000);
        const __m256i step = _mm256_set1_epi32(8);
        __m256 value = _mm256_loadu_ps(row);
        __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), at = index;
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(value), magnitude), infinity);
        for (i = 8; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(row + i);
            const __m256 greater = _mm256_cmp_ps(v, value, _CMP_GT_OQ);
            at = _mm256_add_epi32(at, step);
            value = _mm256_blendv_ps(value, v, greater);
            index = _mm256_blendv_epi8(index, at, _mm256_castps_si256(greater));
            nan = _mm256_or_si256(nan, _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), magnitude),
                                                          infinity));
        }
        if (!_mm256_testz_si256(nan, nan))
            return first_nan(row, n);
        float values[8];
        int32_t indices[8];
        _mm256_storeu_ps(values, value);
        _mm256_storeu_si256((__m256i *)indices, index);
        best = values[0];
        best_index = indices[0];
        for (int lane = 1; lane < 8; lane++)
            if (values[lane] > best || (values[lane] == best && indices[lane] < best_index)) {
                best = values[lane];
                best_index = indices[lane];
            }
    }
#endif
    for (; i < n; i++) {
        if (is_nan(row[i]))
            return first_nan(row, n);
        if (row[i] > best) {
            best = row[i];
            best_index = i;
        }
    }
    return best_index;
}

/* out[r] = argmax of fp32 row r (n values at x + r * stride), for rows < 2^31 values long (the indices are 32-bit
   lanes): returns 1, nothing written, for longer ones. */
int kubeinfer_argmax(const float *x, int64_t rows, int64_t n, int64_t stride, int64_t *out) {
    if (n <= 0 || n > INT32_MAX)
        return 1;
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) out[r] = row_argmax(x + r * stride, n);
    return 0;
}
