"""Tensor names and layouts between HF (Qwen2/Qwen3/Llama) and Megatron-core (TE-style names).

Megatron keeps, per layer, one fused QKV matrix whose rows run group by group
(``[q heads of group g; k_g; v_g]`` for g = 0..groups-1) and one fc1 matrix ``[gate; up]``; the
pre-attention and pre-MLP RMSNorm weights are stored under the fused-linear names
``linear_qkv.layer_norm_weight`` and ``linear_fc1.layer_norm_weight``. These are the names and
layouts of Megatron-LM, Megatron-Bridge, mbridge and slime checkpoints, so ours interoperate.
"""

from __future__ import annotations

from typing import Callable

import torch

from .model_config import ModelArch

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT_LAYER = "output_layer.weight"
LAYER_PREFIX = "decoder.layers."

HF_EMBEDDING = "model.embed_tokens.weight"
HF_FINAL_NORM = "model.norm.weight"
HF_LM_HEAD = "lm_head.weight"

# Per-layer tensors that map one to one: Megatron suffix -> HF suffix (after "model.layers.N.").
_ONE_TO_ONE = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
QKV_WEIGHT = "self_attention.linear_qkv.weight"
QKV_BIAS = "self_attention.linear_qkv.bias"
FC1_WEIGHT = "mlp.linear_fc1.weight"


def layer_suffixes(arch: ModelArch) -> list[str]:
    """Megatron per-layer tensor suffixes present for this architecture, in a stable order."""
    names = ["self_attention.linear_qkv.layer_norm_weight", QKV_WEIGHT]
    if arch.qkv_bias:
        names.append(QKV_BIAS)
    if arch.qk_layernorm:
        names += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
    names += ["self_attention.linear_proj.weight", "mlp.linear_fc1.layer_norm_weight",
              FC1_WEIGHT, "mlp.linear_fc2.weight"]
    return names


def hf_layer_names(arch: ModelArch, layer: int) -> list[str]:
    """Every HF tensor name of one decoder layer."""
    p = f"model.layers.{layer}."
    names = [p + _ONE_TO_ONE[s] for s in layer_suffixes(arch) if s in _ONE_TO_ONE]
    names += [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
    if arch.qkv_bias:
        names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
    names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
    return names


def hf_global_names(arch: ModelArch) -> list[str]:
    names = [HF_EMBEDDING, HF_FINAL_NORM]
    if not arch.tie_word_embeddings:
        names.append(HF_LM_HEAD)
    return names


# --- QKV: [q; k; v] (HF) <-> group-interleaved (Megatron) ------------------------------------

def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: ModelArch) -> torch.Tensor:
    """HF q/k/v projections (weights ``[out, hidden]`` or biases ``[out]``) -> Megatron linear_qkv."""
    g, d = arch.num_query_groups, arch.head_dim
    tail = q.shape[1:]
    parts = [q.reshape(g, arch.heads_per_group * d, *tail), k.reshape(g, d, *tail),
             v.reshape(g, d, *tail)]
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def split_qkv(qkv: torch.Tensor, arch: ModelArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron linear_qkv weight or bias -> HF (q, k, v), each contiguous."""
    g, d, hpg = arch.num_query_groups, arch.head_dim, arch.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return (q.reshape(-1, *tail).contiguous(), k.reshape(-1, *tail).contiguous(),
            v.reshape(-1, *tail).contiguous())


# --- one layer at a time ---------------------------------------------------------------------

RowBlocks = tuple  # equal-sized row blocks of one Megatron tensor, top to bottom


def hf_to_megatron_layer(arch: ModelArch, get: Callable[[str], torch.Tensor], layer: int
                         ) -> dict[str, torch.Tensor | RowBlocks]:
    """Megatron tensors (by suffix) of decoder layer ``layer``; ``get`` fetches HF tensors by name.

    fc1 comes back as the row blocks ``(gate, up)`` rather than their concatenation, so a writer
    can store the two halves without copying them (``torch.cat`` gives the Megatron tensor).
    """
    p = f"model.layers.{layer}."
    out = {}
    for suffix in layer_suffixes(arch):
        if suffix in _ONE_TO_ONE:
            out[suffix] = get(p + _ONE_TO_ONE[suffix])
    out[QKV_WEIGHT] = merge_qkv(*(get(p + f"self_attn.{x}_proj.weight") for x in "qkv"), arch)
    if arch.qkv_bias:
        out[QKV_BIAS] = merge_qkv(*(get(p + f"self_attn.{x}_proj.bias") for x in "qkv"), arch)
    out[FC1_WEIGHT] = (get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight"))
    return {s: out[s] for s in layer_suffixes(arch)}


def megatron_to_hf_tensor(arch: ModelArch, suffix: str, tensor: torch.Tensor, layer: int
                          ) -> dict[str, torch.Tensor]:
    """HF tensors for one Megatron per-layer tensor (QKV and fc1 split into several)."""
    p = f"model.layers.{layer}."
    if suffix in _ONE_TO_ONE:
        return {p + _ONE_TO_ONE[suffix]: tensor}
    if suffix in (QKV_WEIGHT, QKV_BIAS):
        kind = "weight" if suffix == QKV_WEIGHT else "bias"
        return {p + f"self_attn.{x}_proj.{kind}": t
                for x, t in zip("qkv", split_qkv(tensor, arch))}
    if suffix == FC1_WEIGHT:
        gate, up = tensor.chunk(2)  # row halves of a contiguous matrix: views, no copy
        return {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
    raise KeyError(f"unknown Megatron layer tensor {suffix!r}")


def megatron_to_hf_layer(arch: ModelArch, tensors: dict[str, torch.Tensor], layer: int
                         ) -> dict[str, torch.Tensor]:
    """HF tensors of decoder layer ``layer`` from its Megatron tensors (by suffix)."""
    out = {}
    for suffix, tensor in tensors.items():
        out.update(megatron_to_hf_tensor(arch, suffix, tensor, layer))
    return out


def pad_vocab(weight: torch.Tensor, padded_rows: int) -> torch.Tensor:
    """Zero rows appended so the embedding/output layer has Megatron's padded vocab size."""
    if weight.shape[0] == padded_rows:
        return weight
    if weight.shape[0] > padded_rows:
        raise ValueError(f"vocab rows {weight.shape[0]} exceed the padded size {padded_rows}")
    pad = weight.new_zeros(padded_rows - weight.shape[0], *weight.shape[1:])
    return torch.cat([weight, pad])


def expected_hf_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Shape every HF tensor must have under ``arch`` (used to reject inconsistent checkpoints)."""
    h, f, d = arch.hidden_size, arch.ffn_hidden_size, arch.head_dim
    q_out, kv_out = arch.num_attention_heads * d, arch.num_query_groups * d
    shapes = {HF_EMBEDDING: (arch.vocab_size, h), HF_FINAL_NORM: (h,)}
    if not arch.tie_word_embeddings:
        shapes[HF_LM_HEAD] = (arch.vocab_size, h)
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q_out, h), p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h), p + "self_attn.o_proj.weight": (h, q_out),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
        if arch.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q_out,),
                           p + "self_attn.k_proj.bias": (kv_out,),
                           p + "self_attn.v_proj.bias": (kv_out,)})
        if arch.qk_layernorm:
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return shapes
