"""The policy's current weights as full HF-named tensors (for syncing the rollout engine).

Every tensor-parallel rank takes part in the gathers; all of them get the full tensors. Layouts
are undone with ``checkpoint_tools.mapping`` (group-interleaved QKV, ``[gate; up]`` fc1, padded
vocab), so the result is exactly what ``megatron2hf`` would write.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist

from checkpoint_tools.mapping import (FC1_WEIGHT, HF_EMBEDDING, HF_FINAL_NORM, HF_LM_HEAD,
                                      megatron_to_hf_tensor)
from checkpoint_tools.model_config import ModelArch

# local-spec parameter names -> the TE-style suffixes checkpoint_tools maps
_LOCAL_TO_TE = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _gather_tp(param: torch.Tensor, suffix: str) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return param.detach()
    parts = [torch.empty_like(param) for _ in range(tp)]
    dist.all_gather(parts, param.detach().contiguous(), group=ps.get_tensor_model_parallel_group())
    if suffix == FC1_WEIGHT:  # each rank holds [gate_r; up_r]
        halves = [p.chunk(2) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=param.partition_dim)


def iter_hf_tensors(model, arch: ModelArch) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` for every weight of the (unwrapped) GPT model, PP = 1."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() != 1:
        raise NotImplementedError("weight export with pipeline parallelism is not implemented")
    for name, param in model.named_parameters():
        if name.startswith("decoder.layers."):
            layer_str, suffix = name[len("decoder.layers."):].split(".", 1)
            suffix = _LOCAL_TO_TE.get(suffix, suffix)
            full = _gather_tp(param, suffix)
            yield from megatron_to_hf_tensor(arch, suffix, full, int(layer_str)).items()
        elif name == "embedding.word_embeddings.weight":
            yield HF_EMBEDDING, _gather_tp(param, name)[: arch.vocab_size]
        elif name == "output_layer.weight":
            yield HF_LM_HEAD, _gather_tp(param, name)[: arch.vocab_size]
        elif name == "decoder.final_layernorm.weight":
            yield HF_FINAL_NORM, param.detach()
        else:
            raise KeyError(f"no HF name for Megatron parameter {name!r}")


def buckets(tensors: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int):
    """Group named tensors into lists of at most ``bucket_bytes`` (one tensor may exceed it)."""
    bucket, size = [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket
