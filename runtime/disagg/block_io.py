"""A KV block's bytes for a host transport: read out of a cache, or written into one, in the wire's order
`[2 (K, V), num_layers, block_size, num_kv_heads, head_dim]`.

On a host (CPU) cache nothing is copied: the buffers are views of the block's `2 * num_layers` contiguous pieces,
handed to the socket as they are. On a device cache the block goes through one host copy each way (the
device-to-host cost a device transport such as NIXL would avoid).
"""
from collections.abc import Callable

import torch


def _bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.view(torch.uint8).numpy()).cast("B")


def block_buffers(kv_cache: torch.Tensor, block_id: int) -> list[memoryview]:
    """The block's bytes to send (valid while the block is held)."""
    if kv_cache.device.type == "cpu":
        return [_bytes(kv_cache[kv, layer, block_id]) for kv in range(2) for layer in range(kv_cache.shape[1])]
    return [_bytes(kv_cache[:, :, block_id].to("cpu"))]


def block_destination(kv_cache: torch.Tensor, block_id: int) -> tuple[list[memoryview], Callable[[], None]]:
    """Buffers to receive the block's bytes into, and what to call once they are filled."""
    if kv_cache.device.type == "cpu":
        return block_buffers(kv_cache, block_id), lambda: None
    staging = torch.empty(kv_cache[:, :, block_id].shape, dtype=kv_cache.dtype, pin_memory=True)
    return [_bytes(staging)], lambda: kv_cache[:, :, block_id].copy_(staging)
