"""A KV block's bytes for a host transport: read out of a cache, or written into one, in the wire's order
`[2 (K, V), num_layers, block_size, num_kv_heads, head_dim]`.

On a host (CPU) cache nothing is copied: the buffers are views of the block's `2 * num_layers` contiguous pieces,
handed to the socket as they are (cut from one byte view of the whole cache, made once). On a device cache the
block goes through one host copy each way (the device-to-host cost a device transport such as NIXL would avoid).
"""
from collections.abc import Callable

import torch


def _bytes(tensor: torch.Tensor):
    return tensor.view(torch.uint8).numpy()


class BlockBuffers:
    def __init__(self, kv_cache: torch.Tensor):
        self.kv_cache = kv_cache
        self.on_host = kv_cache.device.type == "cpu"
        if self.on_host:   # [2, layers, blocks, bytes of a block's piece]: a piece is one (K or V, layer) of a block
            self._host = _bytes(kv_cache).reshape(2, kv_cache.shape[1], kv_cache.shape[2], -1)

    def read(self, block_id: int) -> list:
        """The block's bytes to send (views valid while the block is held)."""
        if self.on_host:
            return list(self._host[:, :, block_id].reshape(2 * self._host.shape[1], -1))
        return [_bytes(self.kv_cache[:, :, block_id].to("cpu")).reshape(-1)]

    def destination(self, block_id: int) -> tuple[list, Callable[[], None]]:
        """Buffers to receive the block's bytes into, and what to call once they are filled."""
        if self.on_host:
            return self.read(block_id), lambda: None
        staging = torch.empty(self.kv_cache[:, :, block_id].shape, dtype=self.kv_cache.dtype, pin_memory=True)
        return [_bytes(staging).reshape(-1)], lambda: self.kv_cache[:, :, block_id].copy_(staging)
