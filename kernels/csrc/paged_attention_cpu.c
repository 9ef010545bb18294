/* Paged attention on the CPU, straight over the paged KV cache: no gather into dense tensors.

   Scope: fp32 queries; an fp32 cache, or a bf16 one (paged_attention_cpu_bf16kv.c builds this file with KV_BF16:
   its rows are widened to fp32 as they are read, so the arithmetic is the fp32 one); any mix of decode (one query token), short extend (speculative drafts)
   and long extend (prefill chunks) in one call; GQA; causal with an optional sliding window.
   Layouts (see kubeinfer.kernels): q [num_tokens, H, D] with a token stride and a head stride of D;
   k_cache/v_cache [num_blocks, block_size, KVH, D] contiguous; out [num_tokens, H, D] contiguous.
   Query token j of sequence i's chunk of n sits at position seq_lens[i] - n + j and sees keys up to it.

   Work item: a sequence's chunk of a few query tokens with all its heads (decode), or a tile of TILE_Q query
   tokens of one KV head (prefill): the item's query heads read each key and value row once. Items run in parallel under
   OpenMP (the process's one pool: torch's libgomp, already loaded when this library is). Per query row the
   online softmax keeps a running max, a denominator and an accumulator; keys are taken KEY_CHUNK at a time.
   Each row visits only the keys it sees, so no value is ever infinite (the library is built with -ffast-math). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec16.h"   /* VEC16: 16-lane vector code on AVX-512 or AVX2 */

#define TILE_Q 16      /* query tokens per prefill work item: one vector lane each */
#define MAX_ROWS 128   /* query rows (tokens x group heads) per item */
#define MAX_D 256
#define KEY_CHUNK 64     /* keys per step of a prefill tile's online softmax (measured best of 16, 32, 64) */
#define DECODE_CHUNK 32  /* keys per step of a decode item's: with the next chunk prefetched into L2 as it runs,
                            32 and 16 measured alike, 64 slower, 2 chunks ahead no better (docs/benchmarks.md) */
#define CONCAT_(a, b) a##b
#define CONCAT(a, b) CONCAT_(a, b)   /* names pasted after expansion: attend_64_tile + _heads */

/* The cache's element: kv_f32 widens one, kv_load16 sixteen consecutive ones into a vector. */
#if defined(KV_BF16)
typedef uint16_t kv_t;   /* bf16: the high half of an fp32 */
#define KV_EXPORT kubeinfer_paged_attention_bf16kv
static inline float kv_f32(kv_t v) {
    union { uint32_t u; float f; } bits = {(uint32_t)v << 16};
    return bits.f;
}
#if defined(VEC16)
static inline vec16 kv_load16(const kv_t *p) {
    return v16_load_bf16(p);
}
#endif
#else
typedef float kv_t;
#define KV_EXPORT kubeinfer_paged_attention_f32
static inline float kv_f32(kv_t v) { return v; }
#if defined(VEC16)
static inline vec16 kv_load16(const kv_t *p) { return v16_loadu(p); }
#endif
#endif

typedef struct {
    int32_t seq, first, count;      /* query tokens [first, first + count) of the sequence's chunk */
    int32_t kv_begin, kv_end;       /* KV heads [kv_begin, kv_end), with their query heads */
    int32_t tile;                   /* a prefill tile (one KV head, count <= TILE_Q): see TILE_NAME */
} work_item;

/* Where a work item's queries sit: positions [first_pos, last_pos] of its sequence, rows from first_token of q and
   out, the sequence's block table, and the first key any of them sees (0, or the window's start). */
typedef struct {
    int32_t first_pos, last_pos, first_token, key_begin;
    const int32_t *table;
} item_span;

static inline item_span span_of(const work_item *item, const int32_t *cu_seqlens_q, const int32_t *seq_lens,
                                const int32_t *block_tables, int64_t table_stride, int32_t sliding_window) {
    const int32_t q_len = cu_seqlens_q[item->seq + 1] - cu_seqlens_q[item->seq];
    item_span span;
    span.first_pos = seq_lens[item->seq] - q_len + item->first;
    span.last_pos = span.first_pos + item->count - 1;
    span.first_token = cu_seqlens_q[item->seq] + item->first;
    span.table = block_tables + (int64_t)item->seq * table_stride;
    span.key_begin = sliding_window > 0 && span.first_pos - sliding_window + 1 > 0
                         ? span.first_pos - sliding_window + 1 : 0;
    return span;
}

/* The K and V rows of keys [start, start + n) of one sequence, through its block table; `offset` selects a KV head
   inside a token's row (0: the row from its first head). */
static inline void chunk_rows(const int32_t *table, int32_t block_size, const kv_t *k_cache, const kv_t *v_cache,
                              int64_t token_stride, int64_t offset, int32_t start, int32_t n, const kv_t **k_rows,
                              const kv_t **v_rows) {
    int32_t block = start / block_size, in_block = start % block_size;   /* one division a chunk, not one a key */
    int64_t slot = (int64_t)table[block] * block_size + in_block;
    for (int32_t j = 0; j < n; j++) {
        k_rows[j] = k_cache + slot * token_stride + offset;
        v_rows[j] = v_cache + slot * token_stride + offset;
        slot++;
        if (++in_block == block_size && j + 1 < n) {
            in_block = 0;
            slot = (int64_t)table[++block] * block_size;
        }
    }
}

/* The next chunk's K and V lines to fetch into L2, walked a line pair at a time (`row_lines` lines a row, K's and
   V's each) and paced by the work: the decode loop ticks once per key of a row's values and twice per four keys of
   its scores, and by tick t of the chunk's `ticks` the first lines * t / ticks pairs have gone out. Issued in
   bursts (a slice of the chunk before each row) the fetches filled the core's miss buffers and stalled the loads of
   the chunk being computed; a walk that ran ahead of the work (a line pair each tick, so done a third of the way
   into a 7-query-head group's chunk) was 10% slower than even pacing. */
typedef struct {
    const kv_t *const *k_rows, *const *v_rows;
    int32_t row_lines, lines, issued;
    int32_t ticks, owed;   /* owed / ticks: the fraction of a line pair due and not yet issued */
} prefetch_walk;

static inline void prefetch_line(prefetch_walk *walk) {
    const int32_t row = walk->issued / walk->row_lines, offset = 64 * (walk->issued % walk->row_lines);
    __builtin_prefetch((const char *)walk->k_rows[row] + offset, 0, 1);
    __builtin_prefetch((const char *)walk->v_rows[row] + offset, 0, 1);
    walk->issued++;
}

/* A tick of the work: each adds lines / ticks of a line pair to what is owed, issued once it makes a whole pair. */
static inline void prefetch_step(prefetch_walk *walk) {
    if (walk == NULL)
        return;
    walk->owed += walk->lines;
    while (walk->owed >= walk->ticks && walk->issued < walk->lines) {
        walk->owed -= walk->ticks;
        prefetch_line(walk);
    }
}

/* The keys of a chunk [start, start + n) that the query at `pos` sees, as chunk indices [*lo, *hi] (empty when
   *lo > *hi): causal, then the sliding window when one is set. */
static inline void visible_range(int32_t pos, int32_t start, int32_t n, int32_t sliding_window, int32_t *lo,
                                 int32_t *hi) {
    *hi = pos - start < n - 1 ? pos - start : n - 1;
    *lo = sliding_window > 0 && pos - sliding_window + 1 - start > 0 ? pos - sliding_window + 1 - start : 0;
}

/* acc += sum over j in [lo, hi] of probs[j] * (v_rows[j] + offset). With 16-lane vectors (vec16.h) and d a multiple of
   16 (up to 128), the accumulator lives in registers for the whole range. */
static inline void row_values(float *acc, const float *probs, const kv_t *const *v_rows, int32_t offset,
                              int32_t lo, int32_t hi, int32_t d, prefetch_walk *walk) {
#if defined(VEC16)
    if (d % 16 == 0 && d <= 128) {
        vec16 a[8];
        const int32_t n = d / 16;
        for (int32_t x = 0; x < n; x++) a[x] = v16_loadu(acc + 16 * x);
        for (int32_t j = lo; j <= hi; j++) {
            const vec16 p = v16_set1(probs[j]);
            const kv_t *v = v_rows[j] + offset;
            prefetch_step(walk);
            for (int32_t x = 0; x < n; x++) a[x] = v16_fmadd(p, kv_load16(v + 16 * x), a[x]);
        }
        for (int32_t x = 0; x < n; x++) v16_storeu(acc + 16 * x, a[x]);
        return;
    }
#endif
    for (int32_t j = lo; j <= hi; j++) {
        const float prob = probs[j];
        const kv_t *v = v_rows[j] + offset;
        prefetch_step(walk);
        for (int32_t x = 0; x < d; x++) acc[x] += prob * kv_f32(v[x]);
    }
}

/* scores[j] = q . (k_rows[j] + offset) for j in [lo, hi]. With 16-lane vectors and d a multiple of 16, four keys at a time
   in independent FMA chains (a single chain per dot product waits on its own latency). */
static inline void row_scores(const float *q, const kv_t *const *k_rows, int32_t offset, int32_t lo, int32_t hi,
                              int32_t d, float *scores, prefetch_walk *walk) {
    int32_t j = lo;
#if defined(VEC16)
    if (d % 16 == 0 && d <= 256) {
        vec16 qv[16];
        for (int32_t x = 0; x < d / 16; x++) qv[x] = v16_loadu(q + 16 * x);
        for (; j + 4 <= hi + 1; j += 4) {
            const kv_t *k0 = k_rows[j] + offset, *k1 = k_rows[j + 1] + offset;
            const kv_t *k2 = k_rows[j + 2] + offset, *k3 = k_rows[j + 3] + offset;
            dot16 a0 = dot16_zero(), a1 = dot16_zero(), a2 = dot16_zero(), a3 = dot16_zero();
            prefetch_step(walk);
            prefetch_step(walk);
            for (int32_t x = 0; x < d / 16; x++) {
                a0 = dot16_fmadd(qv[x], kv_load16(k0 + 16 * x), a0);
                a1 = dot16_fmadd(qv[x], kv_load16(k1 + 16 * x), a1);
                a2 = dot16_fmadd(qv[x], kv_load16(k2 + 16 * x), a2);
                a3 = dot16_fmadd(qv[x], kv_load16(k3 + 16 * x), a3);
            }
            dot16_sum4(a0, a1, a2, a3, scores + j);
        }
    }
#endif
    for (; j <= hi; j++) {
        const kv_t *k = k_rows[j] + offset;
        prefetch_step(walk);
        float dot = 0.0f;
        for (int32_t x = 0; x < d; x++) dot += q[x] * kv_f32(k[x]);
        scores[j] = dot;
    }
}

/* by_key[j][t] = q_t[:, t] . k_rows[j] for a tile's TILE_Q tokens (one vector lane each) and n keys. */
static inline void tile_scores(float q_t[][TILE_Q], const kv_t *const *k_rows, int32_t n, int32_t d,
                               float by_key[][TILE_Q]) {
    int32_t j = 0;
#if defined(VEC16) && TILE_Q == 16
    for (; j + 4 <= n; j += 4) {   /* four keys in flight: four independent FMA chains */
        const kv_t *k0 = k_rows[j], *k1 = k_rows[j + 1], *k2 = k_rows[j + 2], *k3 = k_rows[j + 3];
        vec16 s0 = v16_zero(), s1 = v16_zero(), s2 = v16_zero(), s3 = v16_zero();
        for (int32_t x = 0; x < d; x++) {
            const vec16 qx = v16_load(q_t[x]);
            s0 = v16_fmadd(qx, v16_set1(kv_f32(k0[x])), s0);
            s1 = v16_fmadd(qx, v16_set1(kv_f32(k1[x])), s1);
            s2 = v16_fmadd(qx, v16_set1(kv_f32(k2[x])), s2);
            s3 = v16_fmadd(qx, v16_set1(kv_f32(k3[x])), s3);
        }
        v16_store(by_key[j], s0);
        v16_store(by_key[j + 1], s1);
        v16_store(by_key[j + 2], s2);
        v16_store(by_key[j + 3], s3);
    }
#endif
    for (; j < n; j++) {
        float lanes[TILE_Q] __attribute__((aligned(64))) = {0};
        for (int32_t x = 0; x < d; x++)
            for (int32_t t = 0; t < TILE_Q; t++) lanes[t] += q_t[x][t] * kv_f32(k_rows[j][x]);
        for (int32_t t = 0; t < TILE_Q; t++) by_key[j][t] = lanes[t];
    }
}

/* One key chunk of the online softmax for one query row: scores[lo..hi] become probabilities under the row's
   running max, which moves up when the chunk's max is higher (what was summed under the old one, the
   denominator and the accumulator, is rescaled to it); the denominator gains the chunk's probabilities. */
static inline void softmax_chunk(float *scores, int32_t lo, int32_t hi, float *running_max, float *denominator,
                                 int32_t *seen, float *acc, int32_t d) {
    float chunk_max = scores[lo];
    for (int32_t j = lo + 1; j <= hi; j++) chunk_max = scores[j] > chunk_max ? scores[j] : chunk_max;
    if (!*seen || chunk_max > *running_max) {
        const float rescale = *seen ? expf(*running_max - chunk_max) : 0.0f;
        *running_max = chunk_max;
        *denominator *= rescale;
        for (int32_t x = 0; x < d; x++) acc[x] *= rescale;
        *seen = 1;
    }
    float sum = 0.0f;
    const float row_max = *running_max;
    for (int32_t j = lo; j <= hi; j++) {   /* branch-free: vectorized, exp included (libmvec) */
        scores[j] = expf(scores[j] - row_max);
        sum += scores[j];
    }
    *denominator += sum;
}

/* One function per head size: with the size known at compile time the inner loops unroll and the row's
   query and accumulator live in registers. attend_any takes any size up to MAX_D. */
#define NAME attend_64
#define TILE_NAME attend_64_tile
#define HEAD_DIM 64
#include "paged_attention_cpu_item.h"
#undef NAME
#undef TILE_NAME
#undef HEAD_DIM

#define NAME attend_128
#define TILE_NAME attend_128_tile
#define HEAD_DIM 128
#include "paged_attention_cpu_item.h"
#undef NAME
#undef TILE_NAME
#undef HEAD_DIM

#define NAME attend_any
#define TILE_NAME attend_any_tile
#define HEAD_DIM head_dim
#include "paged_attention_cpu_item.h"
#undef NAME
#undef TILE_NAME
#undef HEAD_DIM

/* Returns 0, or a negative code when a shape is outside this kernel's scope (the caller checks first). */
int KV_EXPORT(const float *q, int64_t q_token_stride, const kv_t *k_cache, const kv_t *v_cache, const int32_t *cu_seqlens_q, const int32_t *seq_lens,
                                  const int32_t *block_tables, int64_t table_stride, int32_t num_seqs,
                                  int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                  float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads;
    if (head_dim > MAX_D || group > MAX_ROWS || num_heads % num_kv_heads != 0) return -1;
    /* Per item: all KV heads for chunks of a few tokens (decode, drafts), so that each token's K and V rows are
       read whole, as one stream; one KV head per tile of TILE_Q tokens for longer chunks (prefill). */
    const int32_t tile = group * TILE_Q <= MAX_ROWS ? TILE_Q : MAX_ROWS / group;
    /* Fewer sequences than a few per thread (the tail of a batch): split them by KV head too, or cores idle. */
    const int whole = num_seqs >= 4 * omp_get_max_threads();
    int64_t num_items = 0;
    for (int32_t s = 0; s < num_seqs; s++) {
        const int32_t q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
        num_items += whole && q_len * num_heads <= MAX_ROWS ? 1 : (int64_t)((q_len + tile - 1) / tile) * num_kv_heads;
    }
    work_item *items = malloc(sizeof(work_item) * (num_items ? num_items : 1));
    if (items == NULL) return -2;
    int64_t i = 0;
    for (int32_t s = 0; s < num_seqs; s++) {
        const int32_t q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
        if (whole && q_len * num_heads <= MAX_ROWS) {
            items[i++] = (work_item){s, 0, q_len, 0, num_kv_heads, 0};
            continue;
        }
        for (int32_t first = 0; first < q_len; first += tile)
            for (int32_t h = 0; h < num_kv_heads; h++)
                items[i++] = (work_item){s, first, q_len - first < tile ? q_len - first : tile, h, h + 1,
                                         q_len - first > TILE_Q / 4 && tile == TILE_Q};
    }
    typedef void attend_fn(const work_item *, const float *, int64_t, const kv_t *, const kv_t *, const int32_t *,
                           const int32_t *, const int32_t *, int64_t, int32_t, int32_t, int32_t, int32_t, float,
                           int32_t, float *);
    attend_fn *attend = head_dim == 64 ? attend_64 : head_dim == 128 ? attend_128 : attend_any;
    attend_fn *attend_tile = head_dim == 64 ? attend_64_tile : head_dim == 128 ? attend_128_tile : attend_any_tile;
    /* Taken from the end: a chunk's later tiles see more keys, so the largest items do not run last. */
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t w = 0; w < num_items; w++) {
        const work_item *item = &items[num_items - 1 - w];
        (item->tile ? attend_tile : attend)(item, q, q_token_stride, k_cache, v_cache, cu_seqlens_q, seq_lens,
                                           block_tables, table_stride, num_heads, num_kv_heads, head_dim,
                                           block_size, scale, sliding_window, out);
    }
    free(items);
    return 0;
}
