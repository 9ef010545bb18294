/* The per-token ops around the GEMMs, on the CPU, each in one pass over its rows: RMSNorm (with the residual add),
   rotary embedding of q and k, and SiLU-and-mul. PyTorch runs each as five to ten whole-tensor passes (pow, mean,
   rsqrt, mul, cat...), which at prefill sizes stream megabytes through memory per pass.

   Scope: fp32. Rows are addressed by two strides (outer, inner), so a view [tokens, heads, D] split out of a fused
   QKV projection needs no copy; the last dimension is contiguous. Outputs are new contiguous tensors: inputs are
   never written. Rows run in parallel under OpenMP (the process's pool: torch's libgomp) when there are enough of
   them to pay for the fork. The reference of each is in kubeinfer/kernels/references.py. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define PARALLEL_MIN_ELEMENTS 16384   /* below this, one thread: a decode step's few rows */

static inline const float *row_at(const float *base, int64_t row, int64_t inner, int64_t outer_stride,
                                  int64_t inner_stride) {
    return base + (row / inner) * outer_stride + (row % inner) * inner_stride;
}

/* out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps) over rows = outer * inner rows of `cols`.
   With `residual` (rows of `cols`, contiguous): x + residual is normalised, and written to `residual_out`. */
int kubeinfer_rms_norm_f32(const float *x, int64_t outer, int64_t inner, int64_t outer_stride, int64_t inner_stride,
                           const float *residual, const float *weight, int64_t cols, float eps, float *out,
                           float *residual_out) {
    const int64_t rows = outer * inner;
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *src = row_at(x, r, inner, outer_stride, inner_stride);
        float *dst = out + r * cols;
        float sum = 0.0f;
        if (residual) {
            const float *add = residual + r * cols;
            float *keep = residual_out + r * cols;
            for (int64_t c = 0; c < cols; c++) {
                const float v = src[c] + add[c];
                keep[c] = v;
                sum += v * v;
            }
            src = keep;
        } else {
            for (int64_t c = 0; c < cols; c++)
                sum += src[c] * src[c];
        }
        const float inv = 1.0f / sqrtf(sum / (float)cols + eps);
        for (int64_t c = 0; c < cols; c++)
            dst[c] = weight[c] * (src[c] * inv);
    }
    return 0;
}

/* Rotary embedding, NeoX layout (rotate halves), of `heads` heads of size d per token: token t's head h sits at
   x + t * token_stride + h * d. cos_sin: [max_positions, d], cos in the first half, sin in the second. */
static void rotate(const float *x, int64_t token_stride, const int64_t *positions, const float *cos_sin,
                   int64_t tokens, int64_t heads, int64_t d, float *out) {
    const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cosines = cos_sin + positions[t] * d;
        const float *sines = cosines + half;
        for (int64_t h = 0; h < heads; h++) {
            const float *src = x + t * token_stride + h * d;
            float *dst = out + (t * heads + h) * d;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = src[i], x2 = src[half + i];
                dst[i] = x1 * cosines[i] - x2 * sines[i];
                dst[half + i] = x2 * cosines[i] + x1 * sines[i];
            }
        }
    }
}

int kubeinfer_rotary_f32(const int64_t *positions, int64_t tokens, const float *q, int64_t q_stride,
                         int64_t q_heads, const float *k, int64_t k_stride, int64_t k_heads, int64_t d,
                         const float *cos_sin, float *q_out, float *k_out) {
    if (d % 2)
        return 1;
    rotate(q, q_stride, positions, cos_sin, tokens, q_heads, d, q_out);
    rotate(k, k_stride, positions, cos_sin, tokens, k_heads, d, k_out);
    return 0;
}

/* out[r] = silu(x[r, :d]) * x[r, d:] for rows of 2d at x + r * row_stride. The exponent is capped so that it
   stays finite (the build assumes no infinities): silu(g) for g < -80 is then g * 1.8e-35, not -0. */
int kubeinfer_silu_and_mul_f32(const float *x, int64_t rows, int64_t row_stride, int64_t d, float *out) {
#pragma omp parallel for schedule(static) if (rows * d >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = x + r * row_stride, *up = gate + d;
        float *dst = out + r * d;
        for (int64_t c = 0; c < d; c++)
            dst[c] = gate[c] / (1.0f + expf(fminf(-gate[c], 80.0f))) * up[c];   /* finite: -ffast-math */
    }
    return 0;
}
