/* The work-item functions of paged_attention_cpu.c, written once and included once per head size: the
   includer defines NAME (decode and short chunks), TILE_NAME (prefill tiles) and HEAD_DIM (a constant, or
   `head_dim` for any size). With the size known at compile time the inner loops unroll. */
static void NAME(const work_item *item, const float *q, int64_t q_token_stride,
                        const kv_t *k_cache, const kv_t *v_cache, const int32_t *cu_seqlens_q,
                        const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
                        int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                        float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads, d = HEAD_DIM;
    const item_span span = span_of(item, cu_seqlens_q, seq_lens, block_tables, table_stride, sliding_window);
    const int32_t first_pos = span.first_pos, last_pos = span.last_pos;
    const int32_t heads = (item->kv_end - item->kv_begin) * group;          /* query heads per token */
    const int32_t rows = item->count * heads;
    const int32_t *table = span.table;
    const int64_t token_stride = (int64_t)num_kv_heads * d;   /* between two tokens' rows in the cache */

    float qs[MAX_ROWS][MAX_D] __attribute__((aligned(64)));
    float acc[MAX_ROWS][MAX_D] __attribute__((aligned(64)));
    float scores[MAX_ROWS][DECODE_CHUNK] __attribute__((aligned(64)));
    float running_max[MAX_ROWS], denominator[MAX_ROWS];
    int32_t row_pos[MAX_ROWS], seen[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS];
    for (int32_t r = 0; r < rows; r++) {
        const int32_t token = span.first_token + r / heads;
        const int32_t head = item->kv_begin * group + r % heads;
        const float *src = q + token * q_token_stride + (int64_t)head * d;
        for (int32_t x = 0; x < d; x++) qs[r][x] = src[x] * scale;
        for (int32_t x = 0; x < d; x++) acc[r][x] = 0.0f;
        running_max[r] = 0.0f;
        denominator[r] = 0.0f;
        seen[r] = 0;
        row_pos[r] = first_pos + r / heads;
    }

    for (int32_t start = span.key_begin; start <= last_pos; start += DECODE_CHUNK) {
        int32_t n = last_pos + 1 - start;
        if (n > DECODE_CHUNK) n = DECODE_CHUNK;
        const kv_t *k_rows[DECODE_CHUNK], *v_rows[DECODE_CHUNK];
        chunk_rows(table, block_size, k_cache, v_cache, token_stride, 0, start, n, k_rows, v_rows);
        /* The next chunk's rows are fetched into L2 while this one is computed (blocks lie anywhere in the cache,
           so the hardware prefetcher loses the stream at each block edge), paced by this chunk's work (a
           prefetch_walk, in paged_attention_cpu.c); fetched into L1 (prefetcht0), the next chunk evicted this one. */
        const int32_t next_start = start + DECODE_CHUNK;
        int32_t next_n = last_pos + 1 - next_start;
        next_n = next_n < 0 ? 0 : next_n > DECODE_CHUNK ? DECODE_CHUNK : next_n;
        const kv_t *k_next[DECODE_CHUNK], *v_next[DECODE_CHUNK];
        if (next_n > 0)
            chunk_rows(table, block_size, k_cache, v_cache, token_stride, (int64_t)item->kv_begin * d,
                       next_start, next_n, k_next, v_next);
        const int32_t row_lines = ((item->kv_end - item->kv_begin) * d * (int32_t)sizeof(kv_t) + 63) / 64;
        int32_t ticks = 0;   /* the chunk's prefetch ticks: a key's values one, its scores one half */
        for (int32_t r = 0; r < rows; r++) {
            visible_range(row_pos[r], start, n, sliding_window, &lo[r], &hi[r]);
            if (lo[r] <= hi[r])
                ticks += (hi[r] - lo[r] + 1) * 3 / 2;
        }
        prefetch_walk walk = {k_next, v_next, row_lines, next_n * row_lines, 0, ticks > 0 ? ticks : 1, 0};
        /* One KV head at a time, its group's rows together: its K and V rows of the chunk stay in L1 while each of
           the group's query heads reads them. */
        for (int32_t h = item->kv_begin; h < item->kv_end; h++) {
            const int32_t first = (h - item->kv_begin) * group;   /* the head's rows: t * heads + first + g */
            const int32_t offset = h * d;   /* the head's K and V inside a token's row */
            /* Scores, row by row: the row's query stays in registers. */
            for (int32_t t = 0; t < item->count; t++)
                for (int32_t r = t * heads + first; r < t * heads + first + group; r++)
                    row_scores(qs[r], k_rows, offset, lo[r], hi[r], d, scores[r], &walk);
            /* Online softmax, then the values: the row's accumulator stays in registers across the chunk. */
            for (int32_t t = 0; t < item->count; t++)
                for (int32_t r = t * heads + first; r < t * heads + first + group; r++) {
                    if (lo[r] <= hi[r])
                        softmax_chunk(scores[r], lo[r], hi[r], &running_max[r], &denominator[r], &seen[r], acc[r], d);
                    row_values(acc[r], scores[r], v_rows, offset, lo[r], hi[r], d, &walk);
                }
        }
        while (walk.issued < walk.lines)   /* what the ticks left unfetched (the count of ticks is an estimate) */
            prefetch_line(&walk);
    }
    for (int32_t r = 0; r < rows; r++) {
        const int32_t token = cu_seqlens_q[item->seq] + item->first + r / heads;
        const int32_t head = item->kv_begin * group + r % heads;
        float *dst = out + ((int64_t)token * num_heads + head) * d;
        const float inv = denominator[r] > 0.0f ? 1.0f / denominator[r] : 0.0f;
        for (int32_t x = 0; x < d; x++) dst[x] = acc[r][x] * inv;
    }
}

#if defined(VEC16) && TILE_Q == 16
/* Register blocking: what is live in the inner loops must fit the vector registers, or the accumulators spill
   to the stack on every FMA. AVX-512 has 32 registers of 16 lanes: 2 heads x 4 keys of scores, or 16 value
   accumulators. AVX2 has 16 of 8 lanes, so 8 vec16 at most: 2 heads x 2 keys (+ 2 queries, 2 broadcasts), and
   4 value accumulators (+ 2 probabilities, a broadcast). Measured on a Zen 3 (2 vCPUs, 1 thread): prefill
   attention 18 / 26 / 27 GFLOP/s at 128 / 512 / 2,048 tokens with the AVX-512 blocking spilled, after: see
   docs/benchmarks/cpu-runtime.md, "2026-11-26: prefill tiles blocked for AVX2". */
#if defined(__AVX512F__)
#define TILE_KEYS 4
#define TILE_VALUE_REGS 16
#else
#define TILE_KEYS 2
#define TILE_VALUE_REGS 4
#endif
#define TILE_HEADS CONCAT(TILE_NAME, _heads)
/* A prefill tile: one KV head, up to 16 query tokens, one vector lane per token throughout; its query heads two
   at a time (P = 2; P = 1 for the last of an odd group), so that each key or value element, broadcast once,
   feeds both heads. Scores come as by_key[p][j] (head p's 16 tokens' scores for key j, Q transposed once); the
   softmax's max, exponentials, sums and causal mask are lane-wise vector ops; the values go into accumulators
   held transposed (acc_t[p][x] = dimension x of the 16 tokens), 16 / P dimensions at a time in registers.
   Nothing is transposed per key chunk. */
static inline __attribute__((always_inline)) void TILE_HEADS(
        const work_item *item, const float *q, int64_t q_token_stride, const kv_t *k_cache, const kv_t *v_cache,
        const int32_t *cu_seqlens_q, const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
        int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
        int32_t sliding_window, float *out, int32_t head0, const int32_t P) {
    const int32_t d = HEAD_DIM, count = item->count;
    const item_span span = span_of(item, cu_seqlens_q, seq_lens, block_tables, table_stride, sliding_window);
    const int32_t first_pos = span.first_pos, last_pos = span.last_pos, first_token = span.first_token;
    const int32_t key_begin = span.key_begin;
    const int32_t *table = span.table;
    const int64_t token_stride = (int64_t)num_kv_heads * d;
    const mask16 live = (mask16)((1u << count) - 1);   /* lanes holding a query token */

    float q_t[2][MAX_D][TILE_Q] __attribute__((aligned(64)));
    float acc_t[2][MAX_D][TILE_Q] __attribute__((aligned(64)));
    float by_key[2][KEY_CHUNK][TILE_Q] __attribute__((aligned(64)));
    vec16 row_max[2], denominator[2];
    for (int32_t p = 0; p < P; p++) {
        for (int32_t x = 0; x < d; x++)
            for (int32_t t = 0; t < TILE_Q; t++)
                q_t[p][x][t] = t < count ? q[(first_token + t) * q_token_stride + (int64_t)(head0 + p) * d + x] * scale
                                         : 0.0f;
        for (int32_t x = 0; x < d; x++) v16_store(acc_t[p][x], v16_zero());
        row_max[p] = v16_set1(-1e30f);   /* finite: the library is built with -ffast-math */
        denominator[p] = v16_zero();
    }
    for (int32_t start = key_begin; start <= last_pos; start += KEY_CHUNK) {
        int32_t n = last_pos + 1 - start;
        if (n > KEY_CHUNK) n = KEY_CHUNK;
        const kv_t *k_rows[KEY_CHUNK], *v_rows[KEY_CHUNK];
        chunk_rows(table, block_size, k_cache, v_cache, token_stride, (int64_t)item->kv_begin * d, start, n,
                   k_rows, v_rows);
        /* P x keys score registers: a lone head takes twice the keys, so that as many FMA chains are in flight */
        const int32_t keys = TILE_KEYS * 2 / P;
        int32_t j = 0;
        for (; j + keys <= n; j += keys) {
            vec16 s[2 * TILE_KEYS];   /* s[p * keys + c]: head p's scores for key j + c */
            for (int32_t c = 0; c < P * keys; c++) s[c] = v16_zero();
            for (int32_t x = 0; x < d; x++) {
                vec16 b[2 * TILE_KEYS];
                for (int32_t c = 0; c < keys; c++) b[c] = v16_set1(kv_f32(k_rows[j + c][x]));
                for (int32_t p = 0; p < P; p++) {
                    const vec16 qx = v16_load(q_t[p][x]);
                    for (int32_t c = 0; c < keys; c++) s[p * keys + c] = v16_fmadd(qx, b[c], s[p * keys + c]);
                }
            }
            for (int32_t p = 0; p < P; p++)
                for (int32_t c = 0; c < keys; c++) v16_store(by_key[p][j + c], s[p * keys + c]);
        }
        for (; j < n; j++)
            for (int32_t p = 0; p < P; p++) {
                vec16 s = v16_zero();
                for (int32_t x = 0; x < d; x++) s = v16_fmadd(v16_load(q_t[p][x]), v16_set1(kv_f32(k_rows[j][x])), s);
                v16_store(by_key[p][j], s);
            }
        /* Key j is seen by the lanes t with start + j <= first_pos + t (causal) and, with a window,
           start + j > first_pos + t - sliding_window. */
        mask16 seen_by[KEY_CHUNK];
        for (int32_t j = 0; j < n; j++) {
            const int32_t from = start + j - first_pos;   /* the first lane that sees key j */
            uint32_t lanes = from <= 0 ? 0xFFFFu : from >= TILE_Q ? 0u : (0xFFFFu << from) & 0xFFFFu;
            if (sliding_window > 0) {
                const int32_t until = from + sliding_window;   /* lanes from `until` on are past the window */
                lanes &= until <= 0 ? 0u : until >= TILE_Q ? 0xFFFFu : (1u << until) - 1;
            }
            seen_by[j] = (mask16)lanes & live;
        }
        for (int32_t p = 0; p < P; p++) {
            vec16 chunk_max = v16_set1(-1e30f);
            for (int32_t j = 0; j < n; j++)
                chunk_max = v16_mask_max(chunk_max, seen_by[j], chunk_max, v16_load(by_key[p][j]));
            const vec16 new_max = v16_max(row_max[p], chunk_max);
            if (v16_any_gt(new_max, row_max[p])) {   /* a lane's max moved up: rescale */
                const vec16 rescale = v16_exp(v16_sub(row_max[p], new_max));
                denominator[p] = v16_mul(denominator[p], rescale);
                for (int32_t x = 0; x < d; x++)
                    v16_store(acc_t[p][x], v16_mul(v16_load(acc_t[p][x]), rescale));
                row_max[p] = new_max;
            }
            for (int32_t j = 0; j < n; j++) {   /* probabilities, in place: 0 where the lane does not see key j */
                const vec16 probs = v16_maskz_mov(
                    seen_by[j], v16_exp(v16_sub(v16_load(by_key[p][j]), row_max[p])));
                denominator[p] = v16_add(denominator[p], probs);
                v16_store(by_key[p][j], probs);
            }
        }
        const int32_t block = TILE_VALUE_REGS / P;   /* value dimensions per register pass */
        for (int32_t x0 = 0; x0 < d; x0 += block) {
            const int32_t width = d - x0 < block ? d - x0 : block;
            vec16 a[2][TILE_VALUE_REGS];
            for (int32_t p = 0; p < P; p++)
                for (int32_t i = 0; i < width; i++) a[p][i] = v16_load(acc_t[p][x0 + i]);
            for (int32_t j = 0; j < n; j++) {
                const kv_t *v = v_rows[j] + x0;
                vec16 probs[2];
                for (int32_t p = 0; p < P; p++) probs[p] = v16_load(by_key[p][j]);
                for (int32_t i = 0; i < width; i++) {
                    const vec16 b = v16_set1(kv_f32(v[i]));
                    for (int32_t p = 0; p < P; p++) a[p][i] = v16_fmadd(probs[p], b, a[p][i]);
                }
            }
            for (int32_t p = 0; p < P; p++)
                for (int32_t i = 0; i < width; i++) v16_store(acc_t[p][x0 + i], a[p][i]);
        }
    }
    for (int32_t p = 0; p < P; p++) {
        float sums[TILE_Q] __attribute__((aligned(64)));
        v16_store(sums, denominator[p]);
        for (int32_t t = 0; t < count; t++) {
            float *dst = out + ((int64_t)(first_token + t) * num_heads + head0 + p) * d;
            const float inv = sums[t] > 0.0f ? 1.0f / sums[t] : 0.0f;
            for (int32_t x = 0; x < d; x++) dst[x] = acc_t[p][x][t] * inv;
        }
    }
}

static void TILE_NAME(const work_item *item, const float *q, int64_t q_token_stride,
                      const kv_t *k_cache, const kv_t *v_cache, const int32_t *cu_seqlens_q,
                      const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
                      int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                      float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads, head = item->kv_begin * group;
    int32_t g = 0;
    for (; g + 2 <= group; g += 2)
        TILE_HEADS(item, q, q_token_stride, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, table_stride,
                   num_heads, num_kv_heads, head_dim, block_size, scale, sliding_window, out, head + g, 2);
    if (g < group)
        TILE_HEADS(item, q, q_token_stride, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, table_stride,
                   num_heads, num_kv_heads, head_dim, block_size, scale, sliding_window, out, head + g, 1);
}
#undef TILE_HEADS
#else
/* A prefill tile: one KV head, up to TILE_Q query tokens, each of the group's query heads in turn. Scores are
   computed for the TILE_Q tokens at once, one vector lane per token (Q transposed once per item), so the dot
   products need no horizontal sums; softmax and the values then go row by row as in NAME. */
static void TILE_NAME(const work_item *item, const float *q, int64_t q_token_stride,
                      const kv_t *k_cache, const kv_t *v_cache, const int32_t *cu_seqlens_q,
                      const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
                      int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                      float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads, d = HEAD_DIM, count = item->count;
    const item_span span = span_of(item, cu_seqlens_q, seq_lens, block_tables, table_stride, sliding_window);
    const int32_t first_pos = span.first_pos, last_pos = span.last_pos, first_token = span.first_token;
    const int32_t key_begin = span.key_begin;
    const int32_t *table = span.table;
    const int64_t token_stride = (int64_t)num_kv_heads * d;

    float q_t[MAX_D][TILE_Q] __attribute__((aligned(64)));
    float acc[TILE_Q][MAX_D] __attribute__((aligned(64)));
    float by_key[KEY_CHUNK][TILE_Q] __attribute__((aligned(64)));
    float scores[TILE_Q][KEY_CHUNK] __attribute__((aligned(64)));
    float running_max[TILE_Q], denominator[TILE_Q];
    int32_t seen[TILE_Q], lo[TILE_Q], hi[TILE_Q];
    for (int32_t g = 0; g < group; g++) {
        const int32_t head = item->kv_begin * group + g;
        for (int32_t x = 0; x < d; x++)
            for (int32_t t = 0; t < TILE_Q; t++)
                q_t[x][t] = t < count ? q[(first_token + t) * q_token_stride + (int64_t)head * d + x] * scale : 0.0f;
        for (int32_t t = 0; t < TILE_Q; t++) {
            for (int32_t x = 0; x < d; x++) acc[t][x] = 0.0f;
            running_max[t] = denominator[t] = 0.0f;
            seen[t] = 0;
        }
        for (int32_t start = key_begin; start <= last_pos; start += KEY_CHUNK) {
            int32_t n = last_pos + 1 - start;
            if (n > KEY_CHUNK) n = KEY_CHUNK;
            const kv_t *k_rows[KEY_CHUNK], *v_rows[KEY_CHUNK];
            chunk_rows(table, block_size, k_cache, v_cache, token_stride, (int64_t)item->kv_begin * d, start, n,
                       k_rows, v_rows);
            tile_scores(q_t, k_rows, n, d, by_key);
            for (int32_t t = 0; t < count; t++) {
                visible_range(first_pos + t, start, n, sliding_window, &lo[t], &hi[t]);
                if (lo[t] > hi[t]) continue;
                float *row = scores[t];
                for (int32_t j = lo[t]; j <= hi[t]; j++) row[j] = by_key[j][t];   /* the token's scores, as a row */
                softmax_chunk(row, lo[t], hi[t], &running_max[t], &denominator[t], &seen[t], acc[t], d);
                row_values(acc[t], row, v_rows, 0, lo[t], hi[t], d, NULL);
            }
        }
        for (int32_t t = 0; t < count; t++) {
            float *dst = out + ((int64_t)(first_token + t) * num_heads + head) * d;
            const float inv = denominator[t] > 0.0f ? 1.0f / denominator[t] : 0.0f;
            for (int32_t x = 0; x < d; x++) dst[x] = acc[t][x] * inv;
        }
    }
}
#endif
