"""Build a Megatron-core GPT model for an HF architecture and load a torch_dist checkpoint into it.

The trainer's model provider builds on this: it decides the layers' modules (``LayerModules``:
TE's spec, or its fused attention and norm) and this module builds them; the calls go one way;
tests use it to check that converted checkpoints reproduce the HF model's logits at any TP/PP.
Parallel state must be initialised first (``cpu_megatron.init_model_parallel``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from . import cpu_megatron
from .model_config import ModelArch, rope_inv_freq, transformer_config
from .torch_dist import resolve_checkpoint_dir


@dataclasses.dataclass(frozen=True)
class LayerModules:
    """What a caller puts into the GPT layer spec (the trainer's model provider decides, this
    module builds): Transformer Engine's spec, or the local one with its own modules."""

    transformer_engine: bool = False
    core_attention: type | None = None  # the local spec's core attention, replaced
    norm: type | None = None  # Megatron's torch RMSNorm, replaced (Apex's fused norm stays)


def layer_spec(arch: ModelArch, modules: LayerModules = LayerModules()):
    """The GPT layer spec for this architecture: local (no Transformer Engine) unless
    ``modules`` asks for TE's, with ``modules``' attention and norm swapped in."""
    from megatron.core.models.gpt import gpt_layer_specs

    if modules.transformer_engine:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=arch.qk_layernorm)
    spec = gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=arch.qk_layernorm,
                                                    normalization="RMSNorm")
    layer, attention = spec.submodules, spec.submodules.self_attention.submodules
    if modules.core_attention is not None:
        attention.core_attention = modules.core_attention
    if modules.norm is not None:
        _swap_torch_norm((layer, "input_layernorm"), (layer, "pre_mlp_layernorm"),
                         (attention, "q_layernorm"), (attention, "k_layernorm"), norm=modules.norm)
    return spec


def _swap_torch_norm(*slots: tuple, norm: type) -> None:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    for owner, name in slots:
        if getattr(owner, name) is WrappedTorchNorm:  # Apex's fused norm, if present, stays
            setattr(owner, name, norm)


def build_gpt_model(arch: ModelArch, *, dtype: torch.dtype | None = None,
                    padded_vocab_size: int | None = None, spec=None,
                    modules: LayerModules = LayerModules(), **config_overrides):
    """A ``GPTModel`` for this rank's TP/PP slice, with RoPE frequencies identical to HF's;
    its layers ``spec``, else ``layer_spec(arch, modules)``."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    config = transformer_config(arch, tp=tp, pp=pp, dtype=dtype, **config_overrides)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec or layer_spec(arch, modules),
        vocab_size=padded_vocab_size or arch.padded_vocab_size(tp),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta) if float(arch.rope_theta).is_integer() else arch.rope_theta,
    )
    # Megatron hard-codes llama3 scaling constants; take the frequencies from the HF config so
    # every rope variant we accept (default, linear, llama3 with any constants) matches HF.
    if getattr(model, "rotary_pos_emb", None) is not None:
        model.rotary_pos_emb.inv_freq = rope_inv_freq(arch).to(model.rotary_pos_emb.inv_freq.device)
    return model.to(cpu_megatron.default_device())


def load_torch_dist(model, load: str | Path) -> Path:
    """Load model weights from a torch_dist checkpoint (root or iteration dir) at this TP/PP.

    Vocab rows padded for another TP size are reconciled by Megatron (``allow_shape_mismatch``
    on the embedding and output layer). Returns the iteration directory read.
    """
    from megatron.core import dist_checkpointing

    ckpt = resolve_checkpoint_dir(load)
    sharded = model.sharded_state_dict()
    loaded = dist_checkpointing.load(sharded, str(ckpt))
    model.load_state_dict(loaded, strict=False)
    missing = [k for k, v in model.state_dict().items()
               if k not in loaded and not k.endswith("_extra_state") and isinstance(v, torch.Tensor)
               and "rotary_pos_emb" not in k]
    if missing:
        raise RuntimeError(f"{ckpt}: parameters not restored: {missing[:5]}")
    return ckpt


@torch.no_grad()
def forward_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Full-vocab logits ``[batch, seq, padded_vocab]`` on a single pipeline stage (PP = 1).

    Gathers the vocab-parallel output across tensor-parallel ranks.
    """
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    device = cpu_megatron.default_device()
    input_ids = input_ids.to(device)
    b, s = input_ids.shape
    position_ids = torch.arange(s, device=device).unsqueeze(0).expand(b, s)
    mask = cpu_megatron.causal_attention_mask(s, device)
    logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask)
    return gather_from_tensor_model_parallel_region(logits)
