"""The ops the runtime calls. Each routes to its Triton kernel, a native CPU kernel where one exists, or its
PyTorch reference (see `backend`).

Triton modules are imported only when chosen, so the reference path needs no Triton installed.
"""
import torch

from kubeinfer.kernels import references
from kubeinfer.kernels.backend import use_cpu_native, use_triton
from kubeinfer.kernels.metadata import AttentionMetadata


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`; on CUDA, for a decode step's few rows, the Triton kernel that reads the weight in whole rows
    (kernels/skinny_linear.py: no split-K and no reduce after it)."""
    if x.is_cuda and use_triton(x):
        from kubeinfer.kernels import skinny_linear
        if skinny_linear.applies(x, weight):
            return skinny_linear.skinny_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    if use_triton(key):
        from kubeinfer.kernels.kv_store import store_kv as triton_store_kv
        return triton_store_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if use_cpu_native(key):
        from kubeinfer.kernels import cpu_elementwise
        if cpu_elementwise.store_kv(key, value, k_cache, v_cache, slot_mapping):
            return None
    return references.store_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, sliding_window: int | None = None, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """`k_scale`/`v_scale`: what an FP8 cache's values are multiplied by when read (1.0 otherwise)."""
    if use_triton(q):
        if meta.is_decode_only:
            from kubeinfer.kernels.decode_attention import decode_attention
            return decode_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale=k_scale,
                                    v_scale=v_scale)
        from kubeinfer.kernels.extend_attention import extend_attention
        return extend_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale=k_scale, v_scale=v_scale)
    if use_cpu_native(q):
        from kubeinfer.kernels import cpu_attention
        if cpu_attention.supports(q, k_cache):
            return cpu_attention.paged_attention(q, k_cache, v_cache, meta, scale, sliding_window)
    return references.paged_attention(q, k_cache, v_cache, meta, scale, sliding_window, k_scale, v_scale)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    if use_triton(x):
        from kubeinfer.kernels.rmsnorm import rms_norm as triton_rms_norm
        return triton_rms_norm(x, weight, eps, residual)
    if use_cpu_native(x):
        from kubeinfer.kernels import cpu_elementwise
        if (normed := cpu_elementwise.rms_norm(x, weight, eps, residual)) is not None:
            return normed
    return references.rms_norm(x, weight, eps, residual)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(q):
        from kubeinfer.kernels.rotary import rotary_embedding as triton_rotary
        return triton_rotary(positions, q, k, cos_sin_cache)
    if use_cpu_native(q):
        from kubeinfer.kernels import cpu_elementwise
        if (rotated := cpu_elementwise.rotary_embedding(positions, q, k, cos_sin_cache)) is not None:
            return rotated
    return references.rotary_embedding(positions, q, k, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from kubeinfer.kernels.activation import silu_and_mul as triton_silu_and_mul
        return triton_silu_and_mul(x)
    if use_cpu_native(x):
        from kubeinfer.kernels import cpu_elementwise
        if (out := cpu_elementwise.silu_and_mul(x)) is not None:
            return out
    return references.silu_and_mul(x)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(dim=-1)` of a step's `[rows, vocabulary]` logits: the greedy tokens."""
    if use_cpu_native(logits):
        from kubeinfer.kernels import cpu_elementwise
        if (tokens := cpu_elementwise.argmax(logits)) is not None:
            return tokens
    return logits.argmax(dim=-1)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool,
              weights_in_fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return references.moe_route(router_logits, top_k, renormalize, weights_in_fp32)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, first_expert: int = 0) -> torch.Tensor:
    """The experts of a mixture-of-experts layer (see `references.fused_moe`): two grouped GEMMs in Triton; on the
    CPU a loop over the active experts, each one GEMM pair over all its tokens (`cpu_moe`)."""
    if use_triton(x):
        from kubeinfer.kernels.fused_moe import fused_moe as triton_fused_moe
        return triton_fused_moe(x, w13, w2, topk_weights, topk_ids, first_expert)
    if use_cpu_native(x):
        from kubeinfer.kernels import cpu_moe
        return cpu_moe.fused_moe(x, w13, w2, topk_weights, topk_ids, first_expert)
    return references.fused_moe(x, w13, w2, topk_weights, topk_ids, first_expert)


def lora_plan(slot_ids: torch.Tensor, num_slots: int):
    """How `lora_add` computes a forward's updates, made once per forward and shared by every layer: in Triton the
    rows grouped by slot (`lora.lora_groups`), elsewhere `references.lora_plan`."""
    if use_triton(slot_ids):
        from kubeinfer.kernels.lora import lora_groups
        return lora_groups(slot_ids, num_slots)
    return references.lora_plan(slot_ids, num_slots)


def lora_add(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
             plan, parts: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """`out` plus what a batch's LoRA adapters add to a linear layer's output (see `references.lora_delta`), in
    place, as `plan` (`lora_plan(slot_ids)`) says. In Triton: a split shrink and an expand into `out` over the rows
    grouped by slot (a None plan: grouped here). Elsewhere: a shrink and an expand per adapter with many rows, one
    batched pair for all the others; a fused layer's `parts` are expanded each alone."""
    if use_triton(x):
        from kubeinfer.kernels.lora import lora_add as triton_lora_add
        return triton_lora_add(out, x, lora_a, lora_b, slot_ids, plan)
    return references.lora_add_(out, x, lora_a, lora_b, plan, parts)
