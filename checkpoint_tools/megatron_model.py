"""Build a Megatron-core GPT model for an HF architecture and load a torch_dist checkpoint into it.

The trainer's model provider builds on this (adding a fused attention module and the TE spec);
tests use it to check that converted checkpoints reproduce the HF model's logits at any TP/PP.
Parallel state must be initialised first (``cpu_megatron.init_model_parallel``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import cpu_megatron
from .model_config import ModelArch, rope_inv_freq, transformer_config
from .torch_dist import resolve_checkpoint_dir


def layer_spec(arch: ModelArch):
    """The local (no Transformer Engine) GPT layer spec for this architecture."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(qk_layernorm=arch.qk_layernorm, normalization="RMSNorm")


def build_gpt_model(arch: ModelArch, *, dtype: torch.dtype | None = None,
                    padded_vocab_size: int | None = None, spec=None, **config_overrides):
    """A ``GPTModel`` for this rank's TP/PP slice, with RoPE frequencies identical to HF's."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    config = transformer_config(arch, tp=tp, pp=pp, dtype=dtype, **config_overrides)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec or layer_spec(arch),
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
