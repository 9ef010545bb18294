"""KV store kernel vs its reference: the caches must come out identical."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import references  # noqa: E402
from kubeinfer.kernels.kv_store import store_kv  # noqa: E402


@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (2, 80), (8, 128)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_store_kv_matches_reference(device, dtype, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(num_kv_heads * head_dim + block_size)
    num_tokens, num_blocks, num_heads = 37, 5, 2 * num_kv_heads
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:4]] = -1               # padded tokens are skipped
    # K and V as views of a fused QKV projection: non-contiguous token stride.
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen).to(device, dtype)
    key, value = qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slot_mapping = slots.to(device)

    store_kv(key, value, k_cache, v_cache, slot_mapping)
    references.store_kv(key, value, k_ref, v_ref, slot_mapping)

    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    # Spot-check the layout itself: the first kept token landed at block slot // bs, offset slot % bs.
    t = int((slots >= 0).nonzero()[0])
    s = int(slots[t])
    assert torch.equal(k_cache[s // block_size, s % block_size], key[t])
