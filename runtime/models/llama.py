"""The Llama family: Llama 2/3, Mistral (sliding window), Qwen2 (qkv bias), Qwen3 (q/k RMSNorm), and their
mixture-of-experts variants: Mixtral, Qwen2-MoE (with a shared expert), Qwen3-MoE (dense layers among sparse ones).

Inputs are flattened along tokens (`input_ids`, `positions`: `[num_tokens]`); the paged-attention
metadata comes from the forward context. Parameter names follow the Hugging Face checkpoints, except the
fused `qkv_proj` and `gate_up_proj`, which `packed_modules` maps back.
"""
import torch
from torch import nn

from kubeinfer.runtime.cpu_allocator import MMAP_THRESHOLD_BYTES
from kubeinfer.runtime.layers.activation import SiluAndMul
from kubeinfer.runtime.layers.attention import PagedAttention
from kubeinfer.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from kubeinfer.runtime.layers.fused_moe import FusedMoE
from kubeinfer.runtime.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear, ReplicatedLinear,
                                             RowParallelLinear)
from kubeinfer.runtime.layers.norm import RMSNorm
from kubeinfer.runtime.layers.rotary import RotaryEmbedding
from kubeinfer.runtime.models.config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, max_positions: int):
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, config.head_dim, config.num_heads,
                                          config.num_kv_heads, bias=config.qkv_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size, bias=config.o_bias)
        self.rotary_emb = RotaryEmbedding(config.rope, config.head_dim, max_positions)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, config.head_dim, config.sliding_windows[layer])
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v)   # a view: every store_kv takes the token stride
        return self.o_proj(out.flatten(1, 2))


class LlamaMLP(nn.Module):
    """On the CPU a step of many tokens runs in row blocks whose gate/up output stays under glibc's mmap threshold
    (runtime/cpu_allocator.py): above it every such buffer is fresh memory from the kernel, each page faulted in and
    zeroed again on every layer (Qwen2.5-0.5B's 2,048-token step: an 80 MB buffer a layer, ~500,000 faults a pass
    of 16 requests). SmolLM2's 2,048 tokens (25 MB) still run whole."""

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None):
        super().__init__()
        size = intermediate_size or config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [size, size], bias=config.mlp_bias)
        self.down_proj = RowParallelLinear(size, config.hidden_size, bias=config.mlp_bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.block_rows(x)
        if rows >= x.shape[0]:
            return self.down_proj(self.act(self.gate_up_proj(x)))
        return torch.cat([self.down_proj(self.act(self.gate_up_proj(block))) for block in x.split(rows)])

    def block_rows(self, x: torch.Tensor) -> int:
        """Rows of x to run at once: all of them but on the CPU, where the gate/up output must stay under the
        mmap threshold."""
        if not x.is_cpu:
            return x.shape[0]
        return max(1, (MMAP_THRESHOLD_BYTES - 1) // (self.gate_up_proj.out_features * x.element_size()))


class SparseMoeBlock(nn.Module):
    """A router over experts (`FusedMoE`), plus Qwen2-MoE's shared expert behind its sigmoid gate."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        moe = config.moe
        self.gate = ReplicatedLinear(config.hidden_size, moe.num_experts, bias=False)
        self.experts = FusedMoE(moe.num_experts, moe.top_k, config.hidden_size, moe.intermediate_size,
                                moe.renormalize, moe.weights_in_fp32, moe.expert_parallel_size > 1)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = LlamaMLP(config, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = ReplicatedLinear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, max_positions: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer, max_positions)
        sparse = config.moe is not None and config.moe.sparse_layers[layer]
        self.mlp = SparseMoeBlock(config) if sparse else LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i, max_positions) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # checkpoint name -> (our fused parameter, shard id)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.model = LlamaModel(config, max_positions)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            self.lm_head.tied = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
