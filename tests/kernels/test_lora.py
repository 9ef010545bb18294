"""Batched LoRA: the reference against each row's own low-rank product, and the Triton kernel (the interpreter on
the CPU; bf16/fp16 on CUDA under -m gpu) against the reference, with many adapters and base-model rows mixed."""
import pytest
import torch

from kubeinfer.kernels import references


def make(num_tokens, d_in, d_out, num_slots, rank, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, d_in, generator=gen)
    lora_a = torch.randn(num_slots, rank, d_in, generator=gen) / d_in ** 0.5
    lora_b = torch.randn(num_slots, d_out, rank, generator=gen) / rank ** 0.5
    slot_ids = torch.randint(0, num_slots + 1, (num_tokens,), generator=gen)   # num_slots: the base model
    return x, lora_a, lora_b, slot_ids


def test_reference_adds_each_rows_own_adapter_and_nothing_to_base_rows():
    x, lora_a, lora_b, slot_ids = make(29, 24, 40, 4, 16, seed=1)
    slot_ids[:3] = 4
    got = references.lora_delta(x, lora_a, lora_b, slot_ids)
    for t in range(x.shape[0]):
        s = int(slot_ids[t])
        want = torch.zeros(40) if s == 4 else lora_b[s] @ (lora_a[s] @ x[t])
        torch.testing.assert_close(got[t], want, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(got[:3]) == 0


@pytest.mark.parametrize("counts", [[40, 0, 3, 0], [1, 2, 3, 4], [0, 0, 50, 0], [33, 1, 60, 7], [5, 0, 0, 0]])
def test_the_planned_in_place_update_equals_the_definition(counts):
    """Adapters with many rows get their own product pair, the others share one padded batched pair; base rows (the
    last count) are left alone; rows of each adapter are interleaved, as sequences are in a step."""
    from kubeinfer.kernels.references import lora_add_, lora_plan
    x, lora_a, lora_b, _ = make(sum(counts) + 6, 24, 40, 3, 16, seed=sum(counts))
    slot_ids = torch.tensor([s for s, n in enumerate(counts) for _ in range(n)] + [3] * 6)
    slot_ids = slot_ids[torch.randperm(len(slot_ids), generator=torch.Generator().manual_seed(1))]
    base = torch.randn(len(slot_ids), 40)
    want = base + references.lora_delta(x, lora_a, lora_b, slot_ids)
    torch.testing.assert_close(lora_add_(base.clone(), x, lora_a, lora_b, lora_plan(slot_ids, 3)), want,
                               atol=1e-5, rtol=1e-5)
    # A fused layer of two parts (24 + 16 outputs, 8 rank columns each): B block diagonal, each part expanded alone.
    lora_b[:, :24, 8:] = 0
    lora_b[:, 24:, :8] = 0
    want = base + references.lora_delta(x, lora_a, lora_b, slot_ids)
    torch.testing.assert_close(lora_add_(base.clone(), x, lora_a, lora_b, lora_plan(slot_ids, 3), [(0, 24), (24, 16)]),
                               want, atol=1e-5, rtol=1e-5)


triton = pytest.importorskip("triton")


@pytest.mark.parametrize("num_tokens,d_in,d_out,num_slots,rank", [(1, 16, 16, 1, 16), (7, 24, 40, 4, 16),
                                                                   (70, 64, 96, 16, 32), (33, 48, 20, 3, 64),
                                                                   (40, 600, 72, 5, 48)])   # 3 shrink splits
def test_triton_kernel_matches_reference(device, dtype, num_tokens, d_in, d_out, num_slots, rank):
    from kubeinfer.kernels.lora import lora_delta
    x, lora_a, lora_b, slot_ids = (t.to(device) for t in make(num_tokens, d_in, d_out, num_slots, rank,
                                                              seed=num_tokens))
    x, lora_a, lora_b = x.to(dtype), lora_a.to(dtype), lora_b.to(dtype)
    want = references.lora_delta(x.float(), lora_a.float(), lora_b.float(), slot_ids)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(lora_delta(x, lora_a, lora_b, slot_ids).float(), want, **tolerance)


def test_triton_kernel_all_base_rows_add_nothing_and_one_adapter_takes_all(device, dtype):
    if dtype != torch.float32:
        pytest.skip("the routing, not the dtype, is under test here")
    from kubeinfer.kernels.lora import lora_delta
    x, lora_a, lora_b, _ = (t.to(device) for t in make(21, 32, 24, 4, 16, seed=5))
    base = torch.full((21,), 4, device=device)
    assert torch.count_nonzero(lora_delta(x, lora_a, lora_b, base)) == 0
    one = torch.full((21,), 2, device=device)
    torch.testing.assert_close(lora_delta(x, lora_a, lora_b, one), x @ lora_a[2].T @ lora_b[2].T, atol=1e-4, rtol=1e-4)


def test_triton_update_is_added_in_place_with_groups_made_once(device, dtype):
    """The engine's form: `out += update` in place, the rows grouped once (`lora_groups`) and shared by two layers
    of different shapes; `in` spans several shrink splits, the last one partial."""
    if dtype != torch.float32:
        pytest.skip("the routing, not the dtype, is under test here")
    from kubeinfer.kernels.lora import SHRINK_K_CHUNK, lora_add, lora_groups
    x, lora_a, lora_b, slot_ids = (t.to(device) for t in make(37, 2 * SHRINK_K_CHUNK + 40, 56, 6, 16, seed=7))
    x2, lora_a2, lora_b2, _ = (t.to(device) for t in make(37, 24, 300, 6, 32, seed=8))
    groups = lora_groups(slot_ids, 6)
    for x, lora_a, lora_b in ((x, lora_a, lora_b), (x2, lora_a2, lora_b2)):
        base = torch.randn(37, lora_b.shape[1], device=device)
        out = base.clone()
        assert lora_add(out, x, lora_a, lora_b, slot_ids, groups) is out
        torch.testing.assert_close(out, base + references.lora_delta(x, lora_a, lora_b, slot_ids),
                                   atol=1e-4, rtol=1e-4)
