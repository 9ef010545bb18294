"""Plain PyTorch references of every kernel. They define the ops' meaning, and are the runtime's CPU path.

Layouts: activations are flattened along tokens (`[num_tokens, num_heads, head_dim]`); the paged cache is
`[num_blocks, block_size, num_kv_heads, head_dim]` (see `kubeinfer.kernels`). Softmax and norms run in fp32.
"""
import torch
import torch.nn.functional as F

from kubeinfer.kernels.metadata import FP8_DTYPE, FP8_MAX, AttentionMetadata


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write each token's K/V into its slot; tokens with slot -1 are skipped. An FP8 cache gets K / k_scale
    and V / v_scale, saturated to +-FP8_MAX (the scales apply to it only)."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    row = k_cache.shape[2] * k_cache.shape[3]   # one slot's K (or V) of every KV head, as one row
    for cache, new, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
        rows = new.reshape(-1, row)
        if cache.dtype == FP8_DTYPE:   # index_copy_ has no FP8 kernel on the CPU: copy the bytes
            cache, rows = cache.view(torch.uint8), quantize_fp8(rows, scale).view(torch.uint8)
        elif rows.dtype != cache.dtype:   # a 16-bit model over an fp32 cache (the CPU's)
            rows = rows.to(cache.dtype)
        cache.view(-1, row).index_copy_(0, slots, rows)


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _read_cache(tiles: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Cache tiles in the compute dtype: an FP8 cache's values times their scale."""
    if tiles.dtype != FP8_DTYPE:
        return tiles
    return (tiles.float() * scale).to(dtype)


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence, `[length, num_kv_heads, head_dim]`."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:length]


def _visible(query_pos: torch.Tensor, key_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Causal mask, narrowed to the last `sliding_window` keys when set: `[..., queries, keys]`."""
    mask = key_pos <= query_pos
    if sliding_window is not None:
        mask &= key_pos > query_pos - sliding_window
    return mask


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[..., n, H, D]`, k/v `[..., L, KVH, D]`, mask `[..., n, L]` (True = visible) -> `[..., n, H, D]`.

    Softmax(q k^T * scale, masked) v, each query head reading KV head `h // (H // KVH)`; computed by
    PyTorch's scaled_dot_product_attention (fused on CPU, fp32 accumulation).
    """
    out = F.scaled_dot_product_attention(q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3),
                                         attn_mask=mask.unsqueeze(-3), scale=scale, enable_gqa=True)
    return out.transpose(-2, -3)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, sliding_window: int | None = None, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    """One query token per sequence (q `[num_seqs, H, D]`), all sequences in one batched gather."""
    k, v, key_pos = _gather_batch(k_cache, v_cache, meta, q.dtype, k_scale, v_scale)
    query_pos = (meta.seq_lens.long() - 1).view(-1, 1, 1)   # [B, 1 query, 1]
    mask = _visible(query_pos, key_pos, sliding_window)
    return _attend(q.unsqueeze(1), k, v, mask, scale).squeeze(1)


def _gather_batch(k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, dtype: torch.dtype,
                  k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every sequence's K/V up to the longest, `[B, L, KVH, D]` each (padded with whatever block 0 holds: the
    caller's mask hides it), and the key positions `[1, 1, L]`."""
    tables = meta.block_tables[:, :-(-meta.max_seqlen_k // k_cache.shape[1])].long()
    k = _read_cache(k_cache[tables].flatten(1, 2), dtype, k_scale)
    v = _read_cache(v_cache[tables].flatten(1, 2), dtype, v_scale)
    return k, v, torch.arange(k.shape[1], device=k.device).view(1, 1, -1)


def short_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                           scale: float, sliding_window: int | None = None, k_scale: float = 1.0,
                           v_scale: float = 1.0) -> torch.Tensor:
    """A few query tokens per sequence (speculative verification: the last token and its drafts), all
    sequences in one batched gather as in decode: queries padded to `max_seqlen_q`, the padding dropped."""
    k, v, key_pos = _gather_batch(k_cache, v_cache, meta, q.dtype, k_scale, v_scale)
    starts = meta.cu_seqlens_q.long()
    q_lens = (starts[1:] - starts[:-1]).unsqueeze(1)                   # [B, 1]
    offsets = torch.arange(meta.max_seqlen_q, device=q.device).unsqueeze(0)
    real = offsets < q_lens                                            # [B, Q]: not padding
    rows = torch.where(real, starts[:-1].unsqueeze(1) + offsets, 0)
    query_pos = meta.seq_lens.long().unsqueeze(1) - q_lens + offsets   # [B, Q]
    mask = _visible(query_pos.unsqueeze(-1), key_pos, sliding_window)
    return _attend(q[rows], k, v, mask, scale)[real]


SHORT_QUERIES = 8   # at most this many query tokens per sequence: one batched gather instead of a loop


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, sliding_window: int | None = None, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> torch.Tensor:
    """Variable-length query chunks with a causal offset (prefill, chunked prefill, prefix hits, decode)."""
    if meta.max_seqlen_q <= SHORT_QUERIES:
        return short_extend_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale, v_scale)
    out = torch.empty_like(q)
    starts = meta.cu_seqlens_q.tolist()
    for i, seq_len in enumerate(meta.seq_lens.tolist()):
        begin, end = starts[i], starts[i + 1]
        k = _read_cache(_gather_kv(k_cache, meta.block_tables[i], seq_len), q.dtype, k_scale)
        v = _read_cache(_gather_kv(v_cache, meta.block_tables[i], seq_len), q.dtype, v_scale)
        key_pos = torch.arange(seq_len, device=q.device)
        query_pos = key_pos[seq_len - (end - begin):].unsqueeze(-1)
        mask = _visible(query_pos, key_pos.unsqueeze(0), sliding_window)
        out[begin:end] = _attend(q[begin:end], k, v, mask, scale)
    return out


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, sliding_window: int | None = None, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    if meta.is_decode_only:
        return decode_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale, v_scale)
    return extend_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale, v_scale)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm as Llama defines it (fp32 statistics, weight applied in the input dtype).

    With `residual`, first adds it (`x + residual`) and returns `(normed, x + residual)`.
    """
    if residual is not None:
        x = x + residual
        residual = x
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    normed = weight * normed.to(x.dtype)
    return normed if residual is None else (normed, residual)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX/Llama layout (rotate halves). `cos_sin_cache` is `[max_positions, head_dim]`: cos | sin halves."""
    cos, sin = cos_sin_cache[positions].to(q.dtype).unsqueeze(-2).chunk(2, dim=-1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    return rotate(q), rotate(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` of last size `2d`."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool,
              weights_in_fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k softmax routing: `(weights [T, k], expert ids [T, k])`. Softmax in fp32; the weights rescaled to sum
    to 1 when `renormalize`; cast to the logits' dtype unless `weights_in_fp32` (Mixtral keeps fp32)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if weights_in_fp32 else weights.to(router_logits.dtype)), ids


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    """Sum over each token's experts of weight * down(silu(gate(x)) * up(x)).

    x `[T, H]`; w13 `[E, 2I, H]` (gate rows, then up rows) and w2 `[E, H, I]` of experts
    `[first_expert, first_expert + E)`: ids outside that range add nothing (another rank holds them). The
    (token, expert) pairs are grouped by expert; each active expert runs once over its tokens, and the results are
    added into the output in ascending expert order (the order transformers adds them in)."""
    top_k = topk_ids.shape[1]
    out = torch.zeros_like(x)
    for expert, pairs in expert_groups(topk_ids, first_expert, w13.shape[0]):
        tokens = pairs // top_k
        hidden = silu_and_mul(F.linear(x[tokens], w13[expert - first_expert]))
        hidden = F.linear(hidden, w2[expert - first_expert]) * topk_weights.flatten()[pairs, None]
        out.index_add_(0, tokens, hidden.to(out.dtype))
    return out


def expert_groups(topk_ids: torch.Tensor, first_expert: int, num_local: int):
    """(expert, the ids of its (token, k) pairs) for each of experts [first_expert, first_expert + num_local)
    that any token chose, in ascending expert order; pair p is token p // k's choice p % k."""
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=first_expert + num_local).tolist()
    start = sum(counts[:first_expert])
    for expert in range(first_expert, first_expert + num_local):
        pairs = order[start:start + counts[expert]]
        start += counts[expert]
        if pairs.numel():
            yield expert, pairs


def lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
    """What the LoRA adapters add to a linear layer's output: row t gets `(x[t] @ A[s]^T) @ B[s]^T` for its slot
    `s = slot_ids[t]`; a slot outside `[0, num_slots)` (the base model) adds nothing.

    x `[T, in]`; lora_a `[S, R, in]` and lora_b `[S, out, R]`, each adapter's scaling already folded into B and
    its rank padded with zeros to R. The definition: one shrink and one expand per slot present."""
    out = torch.zeros(x.shape[0], lora_b.shape[1], dtype=x.dtype, device=x.device)
    for slot in torch.unique(slot_ids).tolist():
        if 0 <= slot < lora_a.shape[0]:
            rows = (slot_ids == slot).nonzero().flatten()
            out[rows] = F.linear(F.linear(x[rows], lora_a[slot]), lora_b[slot])
    return out


SMALL_GROUP_ROWS = 32   # an adapter's rows in a step up to this (and twice the median) go into `lora_plan`'s padded batch


def lora_plan(slot_ids: torch.Tensor, num_slots: int) -> tuple[list, tuple | None]:
    """How `lora_add_` computes a step's updates, worked out once per forward (the layers share it):
    - adapters with many rows (a prefill) each get their own shrink and expand: `(slot, rows)`, rows None when
      every row of the step is that adapter's;
    - the others share one padded batch of `m` rows per slot (a decode step's few tokens per adapter): one batched
      shrink and expand over all slots, whatever their number, instead of a pair per adapter:
      `(index of each padded row's token, 1/0 for real/padding rows, m)`."""
    slots, counts = torch.unique(slot_ids, return_counts=True)
    present = [(int(s), int(n)) for s, n in zip(slots.tolist(), counts.tolist()) if 0 <= s < num_slots]
    if len(present) == 1 and len(slots) == 1:
        return [(present[0][0], None)], None
    # Small: up to twice the median adapter's rows (a prefill among decodes is not padded out to), at most 32.
    limit = min(SMALL_GROUP_ROWS, 2 * sorted(n for _, n in present)[len(present) // 2]) if present else 0
    big = [(s, (slot_ids == s).nonzero().flatten()) for s, n in present if n > limit or len(present) == 1]
    small = [s for s, n in present if n <= limit and len(present) > 1]
    if not small:
        return big, None
    in_small = torch.zeros(num_slots + 1, dtype=torch.bool, device=slot_ids.device)
    in_small[small] = True
    rows = in_small[slot_ids.clamp(0, num_slots)].nonzero().flatten()      # the small adapters' rows, in order
    row_slots = slot_ids[rows]
    m = max(n for s, n in present if s in small)
    order = torch.argsort(row_slots, stable=True)
    rows, row_slots = rows[order], row_slots[order]
    first = torch.searchsorted(row_slots, row_slots, right=False)          # each row's rank within its slot
    position = row_slots * m + (torch.arange(len(rows), device=rows.device) - first)
    index = torch.zeros(num_slots * m, dtype=torch.int64, device=rows.device)
    valid = torch.zeros(num_slots * m, 1, dtype=torch.float32, device=rows.device)
    index[position], valid[position] = rows, 1.0
    return big, (index, valid, m)


def lora_add_(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, plan,
              parts: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """`out += lora_delta(...)` in place, as `lora_plan` says. `parts`: a fused layer's (first output row, rows) per
    part, each with its own R columns of B (block diagonal): each part is expanded alone, skipping the zero blocks."""
    rank = lora_b.shape[2] // len(parts) if parts else lora_b.shape[2]
    blocks = [(slice(o, o + n), slice(i * rank, (i + 1) * rank)) for i, (o, n) in enumerate(parts)] if parts \
        else [(slice(None), slice(None))]
    groups, padded = plan
    for slot, rows in groups:
        shrunk = F.linear(x if rows is None else x[rows], lora_a[slot])
        if rows is None:   # every row: added in place, part by part
            for out_cols, r in blocks:
                out[:, out_cols].addmm_(shrunk[:, r], lora_b[slot, out_cols, r].T)
        else:              # the parts' products side by side, then one scatter of whole rows
            out.index_add_(0, rows, torch.cat([F.linear(shrunk[:, r], lora_b[slot, out_cols, r])
                                               for out_cols, r in blocks], dim=1))
    if padded is not None:
        index, valid, m = padded
        xp = (x[index] * valid.to(x.dtype)).view(lora_a.shape[0], m, -1)    # padding rows are zero: they add 0
        shrunk = torch.bmm(xp, lora_a.transpose(1, 2))
        delta = torch.cat([torch.bmm(shrunk[:, :, r], lora_b[:, out_cols, r].transpose(1, 2))
                           for out_cols, r in blocks], dim=2)
        out.index_add_(0, index, delta.view(len(index), -1))
    return out
