"""The fused MoE op (`ops.fused_moe`, experts grouped, one GEMM pair per active expert) against the definition
written per token: odd shapes, an expert receiving no token, one expert receiving every token, top-k of 1, 2 and 8,
and experts split over ranks (each rank's share adds up to the whole)."""
import pytest
import torch
import torch.nn.functional as F

from kubeinfer.kernels import ops


def per_token(x, w13, w2, weights, ids):
    """The definition: each token, each of its experts, one at a time."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t], ids[t].tolist()):
            gate, up = F.linear(x[t], w13[expert]).chunk(2)
            out[t] += weight * F.linear(F.silu(gate) * up, w2[expert])
    return out


def make(num_tokens, hidden, intermediate, num_experts, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_tokens, hidden, generator=g), torch.randn(num_experts, 2 * intermediate, hidden, generator=g) / 8,
            torch.randn(num_experts, hidden, intermediate, generator=g) / 8,
            torch.randn(num_tokens, num_experts, generator=g))


@pytest.mark.parametrize("num_tokens,hidden,intermediate,num_experts,top_k",
                         [(1, 16, 8, 4, 1), (7, 24, 40, 8, 2), (33, 64, 48, 8, 8), (100, 32, 16, 60, 4)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_matches_the_per_token_definition(num_tokens, hidden, intermediate, num_experts, top_k, renormalize):
    x, w13, w2, logits = make(num_tokens, hidden, intermediate, num_experts, seed=num_tokens)
    weights, ids = ops.moe_route(logits, top_k, renormalize)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(num_tokens))
    assert ids.shape == (num_tokens, top_k) and (ids.sort(-1).values.diff(dim=-1) > 0).all()   # distinct experts
    torch.testing.assert_close(ops.fused_moe(x, w13, w2, weights, ids), per_token(x, w13, w2, weights, ids),
                               atol=1e-5, rtol=1e-5)


def test_one_expert_takes_every_token_and_the_others_none():
    x, w13, w2, _ = make(19, 16, 8, 6)
    ids, weights = torch.full((19, 1), 4), torch.rand(19, 1)
    torch.testing.assert_close(ops.fused_moe(x, w13, w2, weights, ids), per_token(x, w13, w2, weights, ids))


def test_experts_split_over_ranks_add_up_to_the_whole():
    """Expert parallelism: a rank holding experts [first, first + n) adds only their part."""
    x, w13, w2, logits = make(29, 32, 24, 8, seed=3)
    weights, ids = ops.moe_route(logits, 2, True)
    whole = ops.fused_moe(x, w13, w2, weights, ids)
    halves = [ops.fused_moe(x, w13[first:first + 4], w2[first:first + 4], weights, ids, first_expert=first)
              for first in (0, 4)]
    torch.testing.assert_close(halves[0] + halves[1], whole, atol=1e-6, rtol=1e-6)


def test_routing_weights_dtype():
    logits = torch.randn(5, 8).to(torch.bfloat16)
    assert ops.moe_route(logits, 2, True)[0].dtype == torch.bfloat16          # Qwen: cast to the activations'
    assert ops.moe_route(logits, 2, True, weights_in_fp32=True)[0].dtype == torch.float32   # Mixtral: fp32


# -- the Triton kernel (the interpreter on CPU), against the reference --------------------------------------------
triton = pytest.importorskip("triton")


@pytest.mark.parametrize("num_tokens,hidden,intermediate,num_experts,top_k",
                         [(1, 16, 8, 4, 1), (7, 24, 40, 8, 2), (33, 64, 48, 8, 8), (40, 32, 16, 60, 4)])
def test_triton_kernel_matches_reference(device, dtype, num_tokens, hidden, intermediate, num_experts, top_k):
    """In 16 bits the reference runs in fp32 on the same rounded inputs; the kernel accumulates in fp32 and rounds
    the gate/up activations and its output once each."""
    from kubeinfer.kernels import references
    from kubeinfer.kernels.fused_moe import fused_moe
    x, w13, w2, logits = (t.to(device, dtype) for t in make(num_tokens, hidden, intermediate, num_experts, seed=top_k))
    weights, ids = references.moe_route(logits, top_k, True)
    want = references.fused_moe(x.float(), w13.float(), w2.float(), weights.float(), ids)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids).float(), want, **tolerance)


@pytest.mark.parametrize("config", [(32, 128, 4, 3), (16, 256, 2, 4), (128, 64, 8, 3), (32, 64, 2, 4)])
def test_triton_kernel_launches_match_reference(device, dtype, config):
    """The launches benchmarks/moe_kernel.py --sweep times: tiles narrower, deeper and wider than the default."""
    from kubeinfer.kernels import references
    from kubeinfer.kernels.fused_moe import fused_moe
    x, w13, w2, logits = (t.to(device, dtype) for t in make(5, 96, 72, 8, seed=9))
    weights, ids = references.moe_route(logits, 2, True)
    want = references.fused_moe(x.float(), w13.float(), w2.float(), weights.float(), ids)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids, config=config).float(), want, **tolerance)


def test_triton_kernel_one_expert_takes_all_and_ranks_split(device, dtype):
    if dtype != torch.float32:
        pytest.skip("the shapes, not the dtype, are under test here")
    from kubeinfer.kernels import references
    from kubeinfer.kernels.fused_moe import fused_moe
    x, w13, w2, logits = (t.to(device) for t in make(21, 32, 24, 8, seed=5))
    ids, weights = torch.full((21, 1), 6, device=device), torch.rand(21, 1, device=device)
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids), references.fused_moe(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)
    weights, ids = references.moe_route(logits, 2, False)
    halves = [fused_moe(x, w13[f:f + 4], w2[f:f + 4], weights, ids, first_expert=f, num_experts=8) for f in (0, 4)]
    torch.testing.assert_close(halves[0] + halves[1], references.fused_moe(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)


def test_alignment_gives_each_block_one_expert():
    from kubeinfer.kernels.fused_moe import align_by_expert
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [2, 3]])
    pair_of_row, block_expert, max_blocks = align_by_expert(ids, 5, 4)
    assert max_blocks == (8 + 5 * 3 + 3) // 4
    flat = ids.flatten()
    for block in range(max_blocks):
        pairs = pair_of_row[block * 4:(block + 1) * 4]
        real = pairs[pairs < 8]
        if block_expert[block] < 0:
            assert real.numel() == 0
        else:
            assert (flat[real] == block_expert[block]).all()
    assert sorted(pair_of_row[pair_of_row < 8].tolist()) == list(range(8))   # every pair exactly once


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m", [(1, 128, 8, 16), (7, 5, 2, 4), (64, 128, 8, 16),
                                                                    (150, 3, 1, 16), (33, 60, 4, 32)])
def test_alignment_kernel_groups_as_the_sort_does(monkeypatch, device, dtype, num_tokens, num_experts, top_k,
                                                  block_m):
    """The one-program alignment (decode sizes) against torch's sort (longer batches): the same expert for every
    block, the same pairs in every block (their order inside an expert's run may differ), padding where the sort
    pads; experts with no pair, an expert past the last one used, more pairs than one program's tile."""
    if dtype != torch.float32:
        pytest.skip("integer routing: the dtype is not under test here")
    from kubeinfer.kernels import fused_moe as module
    g = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)]).to(device)
    got = module.align_by_expert(ids, num_experts, block_m)
    monkeypatch.setattr(module, "ALIGN_KERNEL_MAX_PAIRS", -1)
    want = module.align_by_expert(ids, num_experts, block_m)
    assert got[2] == want[2]
    assert torch.equal(got[1].cpu(), want[1].cpu())
    rows_got, rows_want = got[0].view(-1, block_m).cpu(), want[0].view(-1, block_m).cpu()
    assert torch.equal(rows_got.sort(dim=1).values, rows_want.sort(dim=1).values)


@pytest.mark.parametrize("top_k,first", [(1, 0), (2, 0), (8, 0), (2, 4)])
def test_cpu_path_matches_reference(top_k, first):
    """The CPU path (pair rows added in ascending expert order, native SiLU) against the reference."""
    from kubeinfer.kernels import cpu_moe, references
    x, w13, w2, logits = make(37, 48, 40, 8, seed=top_k)
    weights, ids = references.moe_route(logits, top_k, True)
    local = slice(first, first + 4) if first else slice(None)
    got = cpu_moe.fused_moe(x, w13[local], w2[local], weights, ids, first)
    torch.testing.assert_close(got, references.fused_moe(x, w13[local], w2[local], weights, ids, first),
                               atol=1e-6, rtol=1e-6)
