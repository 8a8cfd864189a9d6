"""The architecture facts the engine needs, read from an HF config (v4 or v5 rope keys alike)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    hidden_act: str
    checkpoint_dtype: torch.dtype | None
    hf_config: object  # kept for rope init functions, which read it directly

    @classmethod
    def from_hf(cls, hf_config) -> "ModelConfig":
        mt = hf_config.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {mt!r} not supported; expected one of {SUPPORTED_MODEL_TYPES}")
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        # Qwen2 always has q/k/v biases and no o bias; Llama and Qwen3 follow attention_bias.
        attn_bias = bool(getattr(hf_config, "attention_bias", False))
        dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        return cls(
            model_type=mt,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            max_position_embeddings=hf_config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=True if mt == "qwen2" else attn_bias,
            o_bias=False if mt == "qwen2" else attn_bias,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            qk_norm=mt == "qwen3",
            hidden_act=getattr(hf_config, "hidden_act", "silu"),
            checkpoint_dtype=dtype,
            hf_config=hf_config,
        )

    @property
    def kv_bytes_per_token_per_elem(self) -> int:
        """K and V elements per token over all layers (multiply by the element size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


def rope_inv_freq(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale, exactly as transformers computes them."""
    hf = cfg.hf_config
    params = getattr(hf, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        exps = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
        return 1.0 / (theta ** exps), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS or rope_type == "dynamic":
        # dynamic NTK rescales with the running length, which a static table cannot express.
        raise ValueError(f"rope_type {rope_type!r} is not supported")
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    return inv_freq.float(), float(scale)
