/* 16 fp32 lanes for the attention kernel's vector paths: one AVX-512 register, or a pair of AVX2 ones.

   The kernel's vector code is written once against these names (VEC16 defined); with AVX-512 each is the one
   intrinsic it wraps, with AVX2 and FMA (x86-64-v3: AMD Zen, Intel before AVX-512) each does the same on two
   8-lane halves, and a 16-lane mask is a 16-bit integer as __mmask16 is. Without either, VEC16 is undefined and
   the kernel runs its plain loops. exp is an inline polynomial on both (v8_exp; with AVX-512 the same on 16 lanes,
   where glibc's libmvec call it replaced cost prefill attention 6-19%: docs/benchmarks/cpu-runtime.md). */
#ifndef KUBEINFER_VEC16_H
#define KUBEINFER_VEC16_H
#include <stdint.h>

/* exp's reduction and polynomial over one vector type's intrinsics (`pre`: _mm256 or _mm512): x = n ln2 + r with
   |r| <= ln2 / 2 (ln2 in two parts, so r is exact to fp32), exp(r) into p by the degree-7 Taylor-like polynomial of
   the Cephes library's expf (relative error ~1e-7); x clamped and n rounded by the caller, 2^n applied after. */
#define EXP_POLYNOMIAL(pre, x, n, p) do {                                                                         \
        __typeof__(x) r_ = pre##_fnmadd_ps(n, pre##_set1_ps(0.693359375f), x);                                  \
        r_ = pre##_fnmadd_ps(n, pre##_set1_ps(-2.12194440e-4f), r_);                                            \
        p = pre##_set1_ps(1.9875691500e-4f);                                                                    \
        p = pre##_fmadd_ps(p, r_, pre##_set1_ps(1.3981999507e-3f));                                             \
        p = pre##_fmadd_ps(p, r_, pre##_set1_ps(8.3334519073e-3f));                                             \
        p = pre##_fmadd_ps(p, r_, pre##_set1_ps(4.1665795894e-2f));                                             \
        p = pre##_fmadd_ps(p, r_, pre##_set1_ps(1.6666665459e-1f));                                             \
        p = pre##_fmadd_ps(p, r_, pre##_set1_ps(5.0000001201e-1f));                                             \
        p = pre##_fmadd_ps(p, pre##_mul_ps(r_, r_), pre##_add_ps(r_, pre##_set1_ps(1.0f)));                     \
    } while (0)

#if defined(__AVX512F__)
#include <immintrin.h>
#define VEC16 1
typedef __m512 vec16;
typedef __mmask16 mask16;
static inline vec16 v16_load(const float *p) { return _mm512_load_ps(p); }   /* 64-byte aligned */
static inline vec16 v16_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void v16_store(float *p, vec16 a) { _mm512_store_ps(p, a); }
static inline void v16_storeu(float *p, vec16 a) { _mm512_storeu_ps(p, a); }
static inline vec16 v16_set1(float x) { return _mm512_set1_ps(x); }
static inline vec16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline vec16 v16_fmadd(vec16 a, vec16 b, vec16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec16 v16_add(vec16 a, vec16 b) { return _mm512_add_ps(a, b); }
static inline vec16 v16_sub(vec16 a, vec16 b) { return _mm512_sub_ps(a, b); }
static inline vec16 v16_mul(vec16 a, vec16 b) { return _mm512_mul_ps(a, b); }
static inline vec16 v16_max(vec16 a, vec16 b) { return _mm512_max_ps(a, b); }
static inline float v16_reduce_add(vec16 a) { return _mm512_reduce_add_ps(a); }
/* Lanes of m: max(a, b); other lanes: src. */
static inline vec16 v16_mask_max(vec16 src, mask16 m, vec16 a, vec16 b) { return _mm512_mask_max_ps(src, m, a, b); }
/* Lanes of m: a; other lanes: 0. */
static inline vec16 v16_maskz_mov(mask16 m, vec16 a) { return _mm512_maskz_mov_ps(m, a); }
static inline int v16_any_gt(vec16 a, vec16 b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
/* exp inline: EXP_POLYNOMIAL on 16 lanes, 2^n applied by scalef; arguments clamped to [-87, 88] as v8_exp's below
   (the online softmax starts from a running max of -1e30). */
static inline vec16 v16_exp(vec16 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 p;
    EXP_POLYNOMIAL(_mm512, x, n, p);
    return _mm512_scalef_ps(p, n);
}
/* Sixteen bf16 values (the high halves of fp32s) widened. */
static inline vec16 v16_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* A dot product's running sum (dot16_*): one register either way; see the AVX2 twin below. */
typedef __m512 dot16;
static inline dot16 dot16_zero(void) { return _mm512_setzero_ps(); }
static inline dot16 dot16_fmadd(vec16 a, vec16 b, dot16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline void dot16_sum4(dot16 a, dot16 b, dot16 c, dot16 d, float *out) {
    out[0] = _mm512_reduce_add_ps(a);
    out[1] = _mm512_reduce_add_ps(b);
    out[2] = _mm512_reduce_add_ps(c);
    out[3] = _mm512_reduce_add_ps(d);
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC16 1
typedef struct { __m256 lo, hi; } vec16;
typedef uint16_t mask16;
static inline vec16 v16_pair(__m256 lo, __m256 hi) { vec16 r = {lo, hi}; return r; }
static inline vec16 v16_load(const float *p) { return v16_pair(_mm256_load_ps(p), _mm256_load_ps(p + 8)); }
static inline vec16 v16_loadu(const float *p) { return v16_pair(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void v16_store(float *p, vec16 a) { _mm256_store_ps(p, a.lo); _mm256_store_ps(p + 8, a.hi); }
static inline void v16_storeu(float *p, vec16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
static inline vec16 v16_set1(float x) { const __m256 v = _mm256_set1_ps(x); return v16_pair(v, v); }
static inline vec16 v16_zero(void) { return v16_pair(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline vec16 v16_fmadd(vec16 a, vec16 b, vec16 c) {
    return v16_pair(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline vec16 v16_add(vec16 a, vec16 b) { return v16_pair(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline vec16 v16_sub(vec16 a, vec16 b) { return v16_pair(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
static inline vec16 v16_mul(vec16 a, vec16 b) { return v16_pair(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline vec16 v16_max(vec16 a, vec16 b) { return v16_pair(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
static inline float v16_reduce_add(vec16 a) {
    const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
/* Eight bits of a mask as eight all-ones or all-zeros lanes. */
static inline __m256 v16_lanes(unsigned bits) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), bit), bit));
}
static inline vec16 v16_mask_max(vec16 src, mask16 m, vec16 a, vec16 b) {
    return v16_pair(_mm256_blendv_ps(src.lo, _mm256_max_ps(a.lo, b.lo), v16_lanes(m & 0xFFu)),
                    _mm256_blendv_ps(src.hi, _mm256_max_ps(a.hi, b.hi), v16_lanes(m >> 8)));
}
static inline vec16 v16_maskz_mov(mask16 m, vec16 a) {
    return v16_pair(_mm256_and_ps(a.lo, v16_lanes(m & 0xFFu)), _mm256_and_ps(a.hi, v16_lanes(m >> 8)));
}
static inline int v16_any_gt(vec16 a, vec16 b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)) | _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ));
}
/* exp on 8 lanes, inline: EXP_POLYNOMIAL, times 2^n built in the exponent bits. Arguments are clamped to
   [-87, 88], where 2^n stays a normal number. libmvec's version is a call per 8 lanes, and it takes a scalar path
   lane by lane for arguments outside that range: the online softmax starts from a running max of -1e30, and a
   tile's lanes without a query token never leave it (16% of a 4 x 200-token prefill's attention was expf, 3% its
   scalar path, before this). */
static inline __m256 v8_exp(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 p;
    EXP_POLYNOMIAL(_mm256, x, n, p);
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}
static inline vec16 v16_exp(vec16 x) { return v16_pair(v8_exp(x.lo), v8_exp(x.hi)); }
static inline __m256 v16_bf16_half(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vec16 v16_load_bf16(const uint16_t *p) { return v16_pair(v16_bf16_half(p), v16_bf16_half(p + 8)); }
/* A dot product's running sum, folded to 8 lanes as it goes: both halves of a vec16 product add into one register,
   so four dot products in flight hold 4 registers, not 8, beside a 64-wide query's 8. dot16_sum4 finishes four
   at once: three horizontal adds and one 128-bit add give their four totals, where four v16_reduce_add would take
   ~28 shuffles and adds (measured in the decode attention: docs/benchmarks.md). */
typedef __m256 dot16;
static inline dot16 dot16_zero(void) { return _mm256_setzero_ps(); }
static inline dot16 dot16_fmadd(vec16 a, vec16 b, dot16 c) {
    return _mm256_fmadd_ps(a.hi, b.hi, _mm256_fmadd_ps(a.lo, b.lo, c));
}
static inline void dot16_sum4(dot16 a, dot16 b, dot16 c, dot16 d, float *out) {
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);   /* per 128-bit half: a01 a23 b01 b23 ... */
    const __m256 abcd = _mm256_hadd_ps(ab, cd);                          /* per half: a b c d partial sums */
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
#endif

#endif
