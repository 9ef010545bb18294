/* The work-item functions of paged_attention_cpu.c, written once and included once per head size: the
   includer defines NAME (decode and short chunks), TILE_NAME (prefill tiles) and HEAD_DIM (a constant, or
   `head_dim` for any size). With the size known at compile time the inner loops unroll. */
static void NAME(const work_item *item, const float *q, int64_t q_token_stride,
                        const float *k_cache, const float *v_cache, const int32_t *cu_seqlens_q,
                        const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
                        int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                        float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads, d = HEAD_DIM;
    const int32_t q_len = cu_seqlens_q[item->seq + 1] - cu_seqlens_q[item->seq];
    const int32_t first_pos = seq_lens[item->seq] - q_len + item->first;   /* position of the item's first query */
    const int32_t heads = (item->kv_end - item->kv_begin) * group;          /* query heads per token */
    const int32_t rows = item->count * heads;
    const int32_t *table = block_tables + (int64_t)item->seq * table_stride;
    const int64_t token_stride = (int64_t)num_kv_heads * d;   /* between two tokens' rows in the cache */

    float qs[MAX_ROWS][MAX_D] __attribute__((aligned(64)));
    float acc[MAX_ROWS][MAX_D] __attribute__((aligned(64)));
    float scores[MAX_ROWS][KEY_CHUNK] __attribute__((aligned(64)));
    float running_max[MAX_ROWS], denominator[MAX_ROWS];
    int32_t row_pos[MAX_ROWS], row_kv[MAX_ROWS], seen[MAX_ROWS], lo[MAX_ROWS], hi[MAX_ROWS];
    for (int32_t r = 0; r < rows; r++) {
        const int32_t token = cu_seqlens_q[item->seq] + item->first + r / heads;
        const int32_t head = item->kv_begin * group + r % heads;
        const float *src = q + token * q_token_stride + (int64_t)head * d;
        for (int32_t x = 0; x < d; x++) qs[r][x] = src[x] * scale;
        for (int32_t x = 0; x < d; x++) acc[r][x] = 0.0f;
        running_max[r] = 0.0f;
        denominator[r] = 0.0f;
        seen[r] = 0;
        row_pos[r] = first_pos + r / heads;
        row_kv[r] = (head / group) * d;   /* offset of the row's KV head inside a token's row */
    }
    const int32_t last_pos = first_pos + item->count - 1;
    int32_t key_begin = 0;
    if (sliding_window > 0 && first_pos - sliding_window + 1 > 0) key_begin = first_pos - sliding_window + 1;

    for (int32_t start = key_begin; start <= last_pos; start += KEY_CHUNK) {
        int32_t n = last_pos + 1 - start;
        if (n > KEY_CHUNK) n = KEY_CHUNK;
        const float *k_rows[KEY_CHUNK], *v_rows[KEY_CHUNK];
        chunk_rows(table, block_size, k_cache, v_cache, token_stride, 0, start, n, k_rows, v_rows);
        /* The next chunk's rows are fetched while this one is computed: blocks lie anywhere in the cache, so
           the hardware prefetcher loses the stream at each block edge. */
        const int32_t next_end = start + 2 * KEY_CHUNK <= last_pos + 1 ? start + 2 * KEY_CHUNK : last_pos + 1;
        for (int32_t pos = start + KEY_CHUNK; pos < next_end; pos++) {
            const int64_t slot = (int64_t)table[pos / block_size] * block_size + pos % block_size;
            const char *k_next = (const char *)(k_cache + slot * token_stride + (int64_t)item->kv_begin * d);
            const char *v_next = (const char *)(v_cache + slot * token_stride + (int64_t)item->kv_begin * d);
            for (int32_t line = 0; line < (item->kv_end - item->kv_begin) * d * 4; line += 64) {
                __builtin_prefetch(k_next + line);
                __builtin_prefetch(v_next + line);
            }
        }
        for (int32_t r = 0; r < rows; r++) visible_range(row_pos[r], start, n, sliding_window, &lo[r], &hi[r]);
        /* Scores, row by row: the row's query stays in registers; the chunk's keys stay in L1 across rows. */
        for (int32_t r = 0; r < rows; r++)
            row_scores(qs[r], k_rows, row_kv[r], lo[r], hi[r], d, scores[r]);
        /* Online softmax: the running max moves up, what was summed under the old one is rescaled. */
        for (int32_t r = 0; r < rows; r++)
            if (lo[r] <= hi[r]) softmax_chunk(scores[r], lo[r], hi[r], &running_max[r], &denominator[r], &seen[r],
                                              acc[r], d);
        for (int32_t r = 0; r < rows; r++)   /* the row's accumulator stays in registers across the chunk */
            row_values(acc[r], scores[r], v_rows, row_kv[r], lo[r], hi[r], d);
    }
    for (int32_t r = 0; r < rows; r++) {
        const int32_t token = cu_seqlens_q[item->seq] + item->first + r / heads;
        const int32_t head = item->kv_begin * group + r % heads;
        float *dst = out + ((int64_t)token * num_heads + head) * d;
        const float inv = denominator[r] > 0.0f ? 1.0f / denominator[r] : 0.0f;
        for (int32_t x = 0; x < d; x++) dst[x] = acc[r][x] * inv;
    }
}

/* A prefill tile: one KV head, up to TILE_Q query tokens, each of the group's query heads in turn. Scores are
   computed for the TILE_Q tokens at once, one vector lane per token (Q transposed once per item), so the dot
   products need no horizontal sums; softmax and the values then go row by row as in NAME. */
static void TILE_NAME(const work_item *item, const float *q, int64_t q_token_stride,
                      const float *k_cache, const float *v_cache, const int32_t *cu_seqlens_q,
                      const int32_t *seq_lens, const int32_t *block_tables, int64_t table_stride,
                      int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                      float scale, int32_t sliding_window, float *out) {
    const int32_t group = num_heads / num_kv_heads, d = HEAD_DIM, count = item->count;
    const int32_t q_len = cu_seqlens_q[item->seq + 1] - cu_seqlens_q[item->seq];
    const int32_t first_pos = seq_lens[item->seq] - q_len + item->first;
    const int32_t first_token = cu_seqlens_q[item->seq] + item->first;
    const int32_t *table = block_tables + (int64_t)item->seq * table_stride;
    const int64_t token_stride = (int64_t)num_kv_heads * d;
    const int32_t last_pos = first_pos + count - 1;
    int32_t key_begin = 0;
    if (sliding_window > 0 && first_pos - sliding_window + 1 > 0) key_begin = first_pos - sliding_window + 1;

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
            const float *k_rows[KEY_CHUNK], *v_rows[KEY_CHUNK];
            chunk_rows(table, block_size, k_cache, v_cache, token_stride, (int64_t)item->kv_begin * d, start, n,
                       k_rows, v_rows);
            tile_scores(q_t, k_rows, n, d, by_key);
            for (int32_t t = 0; t < count; t++) {
                visible_range(first_pos + t, start, n, sliding_window, &lo[t], &hi[t]);
                if (lo[t] > hi[t]) continue;
                float *row = scores[t];
                for (int32_t j = lo[t]; j <= hi[t]; j++) row[j] = by_key[j][t];   /* the token's scores, as a row */
                softmax_chunk(row, lo[t], hi[t], &running_max[t], &denominator[t], &seen[t], acc[t], d);
                row_values(acc[t], row, v_rows, 0, lo[t], hi[t], d);
            }
        }
        for (int32_t t = 0; t < count; t++) {
            float *dst = out + ((int64_t)(first_token + t) * num_heads + head) * d;
            const float inv = denominator[t] > 0.0f ? 1.0f / denominator[t] : 0.0f;
            for (int32_t x = 0; x < d; x++) dst[x] = acc[t][x] * inv;
        }
    }
}
