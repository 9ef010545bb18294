"""The router with the Triton backend forced: one chunked-prefill + decode step end to end, vs the torch backend."""
import pytest
import torch

pytest.importorskip("triton")

from kubeinfer.kernels import get_backend, ops, set_backend  # noqa: E402


@pytest.fixture
def backend():
    before = get_backend()
    yield set_backend
    set_backend(before)


@pytest.mark.parametrize("decode_only", [False, True], ids=["mixed", "decode"])
def test_step_through_ops_matches_torch_backend(device, dtype, tol, make_paged, backend, decode_only):
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 64, 16
    seq_lens, q_lens = ([9, 40, 30], [1, 1, 1]) if decode_only else ([9, 40, 30], [9, 7, 1])
    q, k_cache, v_cache, meta, _, _ = make_paged(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size,
                                                 dtype, device, seed=21)
    # Slots of this step's new tokens: the last q_len positions of each sequence, through its table.
    slots = []
    for i, (n, m) in enumerate(zip(seq_lens, q_lens)):
        for pos in range(n - m, n):
            slots.append(int(meta.block_tables[i, pos // block_size]) * block_size + pos % block_size)
    meta.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    gen = torch.Generator().manual_seed(4)
    positions = meta.slot_mapping.new_tensor([p for n, m in zip(seq_lens, q_lens) for p in range(n - m, n)])
    cache = torch.randn(64, head_dim, generator=gen).to(device)
    k = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(device, dtype)
    hidden = torch.randn(len(slots), 2 * 96, generator=gen).to(device, dtype)
    weight = torch.randn(96, generator=gen).to(device, dtype)

    def step(name, to):
        """The chain of ops on the backend `name`, its inputs cast by `to`."""
        backend(name)
        kc, vc = to(k_cache).clone(), to(v_cache).clone()
        qr, kr = ops.rotary_embedding(positions, to(q), to(k), cache)
        ops.store_kv(kr, to(v), kc, vc, meta.slot_mapping)
        attn = ops.paged_attention(qr, kc, vc, meta, head_dim ** -0.5, sliding_window=24)
        mlp = ops.rms_norm(ops.silu_and_mul(to(hidden)), to(weight), 1e-6)
        return attn, kc, mlp

    # The reference runs in fp32 on the same (already rounded) inputs: a 16-bit reference on a GPU rounds
    # its own scores and probabilities, and would add its error to the kernels' (seen on an H100).
    got = step("triton", lambda t: t)
    want = step("torch", lambda t: t.float())
    for name, a, b, kind in zip(("attention", "k cache", "mlp"), got, want, ("attention", "elementwise", "elementwise")):
        torch.testing.assert_close(a.float(), b, **tol(dtype, kind), msg=lambda m: f"{name}: {m}")
