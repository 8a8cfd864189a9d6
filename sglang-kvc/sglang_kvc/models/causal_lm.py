"""Decoder-only transformer for the Qwen2/Qwen2.5, Qwen3 and Llama-3 families.

Tokens of all requests in a step are packed into one flat [T, ...] batch; attention is delegated
to an attention backend (attention.py) that knows which KV slots each request owns. Numerics
follow transformers (fp32 RMSNorm statistics, cos/sin cast to the activation dtype) so greedy
outputs match HF token for token in fp32.

The residual stream is carried beside the hidden states, as in vLLM: each norm adds the previous
block's output into the residual and normalises it in one op (fused_ops.add_rmsnorm, a Triton
kernel on CUDA); RoPE, the K/V store and silu*mul are fused the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.fused_ops import add_rmsnorm, rmsnorm, rope_, silu_mul
from .config import ModelConfig, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normed x; with `residual`: (normed residual + x, residual + x)."""
        if residual is None:
            return rmsnorm(x, self.weight, self.eps)
        return add_rmsnorm(x, residual, self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin table indexed by logical position (which may exceed the slots a request holds)."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq, scale = rope_inv_freq(cfg)
        # rope init functions build on the CPU; follow the device the model is being built on.
        inv_freq = inv_freq.to(torch.get_default_device())
        positions = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """Rotates q [T, Hq, D] and k [T, Hkv, D] in place; returns them."""
        return rope_(q, k, positions, self.cos, self.sin)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # q, k and v in one matmul; the loader writes each HF matrix into its row block.
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, positions, rotary: Rotary, attn) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(T, self.num_heads, self.head_dim)
        k = k.reshape(T, self.num_kv_heads, self.head_dim)
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # The backend applies RoPE (fused with its K/V store where it can) and attends.
        out = attn.forward_rotary(self.layer_id, q, k, v, positions, rotary)
        return self.o_proj(out.reshape(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} not supported (only silu)")
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, residual, positions, rotary, attn):
        """(block output, residual stream); the first layer gets residual None and x = embeddings.
        Same sums as x + attn(norm(x)), then + mlp(norm(.)): the adds just move into the norms."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rotary, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg, max_positions)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn) -> torch.Tensor:
        """Final normed hidden states [T, hidden] for the flat token batch."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, self.rotary, attn)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """Matmul in the model dtype, then fp32, as HF does: logprobs then agree with an HF
        forward. `upcast=False` leaves the fp32 copy to the sampler, which skips it for greedy
        steps without logprobs (argmax of the same values; [B, vocab] fp32 is the largest
        tensor of a decode step)."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        out = F.linear(hidden, weight)
        return out.float() if upcast else out
