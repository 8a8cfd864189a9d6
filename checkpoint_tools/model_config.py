"""HF ``config.json`` -> the architecture facts Megatron needs (and back).

This is the one place that knows how a Qwen2/Qwen2.5, Qwen3 or Llama-3.x HF config maps onto a
Megatron-core GPT model; the trainer's model provider and both converters use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from .cli import ConverterParser  # noqa: F401 - its home is cli.py (no torch); re-exported


class CheckpointError(ValueError):
    """A checkpoint or config that cannot be used; the message names the file and the problem."""


# model_type -> (architecture class, has q/k norm by construction)
SUPPORTED_MODEL_TYPES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}



def run_converter(prog: str, convert) -> int:
    """A converter CLI's tail: ``convert()`` returns the path written; a CheckpointError (the
    user's input) is one ``prog: error: ...`` line and exit status 2, never a traceback."""
    import sys
    import time

    start = time.perf_counter()
    try:
        out = convert()
    except CheckpointError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"{prog}: wrote {out} in {time.perf_counter() - start:.1f}s")
    return 0


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """Dense decoder facts shared by HF and Megatron. Sizes are the HF (unpadded) ones."""

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    norm_epsilon: float
    rope_theta: float
    rope_parameters: dict
    max_position_embeddings: int
    dtype: torch.dtype

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    def padded_vocab_size(self, tp: int = 1, divisible_by: int = 128) -> int:
        """Megatron's padding: a multiple of ``divisible_by * tp`` (so each TP rank gets equal rows)."""
        multiple = divisible_by * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)


def read_config_json(hf_dir: str | Path) -> dict:
    path = Path(hf_dir) / "config.json"
    if not Path(hf_dir).is_dir():
        raise CheckpointError(f"{hf_dir}: not a directory (expected a Hugging Face model directory)")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a Hugging Face checkpoint needs its config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e


def arch_from_hf_config(config: dict, source: str = "config.json") -> ModelArch:
    """Validate an HF config dict and extract the architecture. ``source`` names it in errors."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = config.get("architectures")
        raise CheckpointError(
            f"{source}: unsupported architecture model_type={model_type!r} (architectures={archs}); "
            f"supported: {', '.join(f'{k} ({v})' for k, v in SUPPORTED_MODEL_TYPES.items())}"
        )
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        groups = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        rope = _rope_parameters(config)
        arch = ModelArch(
            model_type=model_type,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            ffn_hidden_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_query_groups=groups,
            head_dim=head_dim,
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type != "llama")),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            qk_layernorm=model_type == "qwen3",
            norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope["rope_theta"]),
            rope_parameters=rope,
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            dtype=_DTYPES.get(str(config.get("dtype") or config.get("torch_dtype") or "float32"),
                              torch.float32),
        )
    except KeyError as e:
        raise CheckpointError(f"{source}: missing required field {e.args[0]!r}") from e
    if heads % groups:
        raise CheckpointError(f"{source}: num_attention_heads={heads} is not a multiple of "
                              f"num_key_value_heads={groups}")
    if config.get("mlp_bias"):
        raise CheckpointError(f"{source}: mlp_bias=true is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: hidden_act={config['hidden_act']!r} is not supported "
                              "(SwiGLU with silu only)")
    if model_type == "qwen2" and config.get("use_sliding_window"):
        raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
    return arch


def _rope_parameters(config: dict) -> dict:
    """Rope settings from either the transformers-5 ``rope_parameters`` or v4 ``rope_theta``/``rope_scaling``."""
    rope = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    rope.update({k: v for k, v in scaling.items() if k not in rope})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if rope["rope_type"] not in ("default", "llama3", "linear"):
        raise CheckpointError(f"rope_type={rope['rope_type']!r} is not supported "
                              "(supported: default, linear, llama3)")
    return rope


def load_arch(hf_dir: str | Path) -> ModelArch:
    return arch_from_hf_config(read_config_json(hf_dir), source=str(Path(hf_dir) / "config.json"))


def rope_inv_freq(arch: ModelArch) -> torch.Tensor:
    """Inverse RoPE frequencies exactly as transformers computes them (llama3/linear included)."""
    base = arch.rope_theta
    dim = arch.head_dim
    # float32 arithmetic, as both transformers and Megatron do it, so the frequencies match bit for bit
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    p = arch.rope_parameters
    if p["rope_type"] == "linear":
        inv_freq = inv_freq / float(p["factor"])
    elif p["rope_type"] == "llama3":
        factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old_len = float(p["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def _megatron_sizes(arch: ModelArch) -> dict:
    """Fields named alike in Megatron-LM's args and in ``TransformerConfig``."""
    return dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        add_qkv_bias=arch.qkv_bias,
        add_bias_linear=False,
        qk_layernorm=arch.qk_layernorm,
        normalization="RMSNorm",
    )


def megatron_args(arch: ModelArch, tp: int = 1, pp: int = 1, hf_config: dict | None = None) -> dict:
    """The Megatron-LM argument names (as in ``common.pt['args']``) that rebuild this model."""
    return dict(
        **_megatron_sizes(arch),
        group_query_attention=arch.num_query_groups != arch.num_attention_heads,
        norm_epsilon=arch.norm_epsilon,
        swiglu=True,
        position_embedding_type="rope",
        use_rotary_position_embeddings=True,
        rotary_base=arch.rope_theta,
        rotary_percent=1.0,
        use_rope_scaling=arch.rope_parameters["rope_type"] == "llama3",
        rope_scaling_factor=float(arch.rope_parameters.get("factor", 1.0)),
        untie_embeddings_and_output_weights=not arch.tie_word_embeddings,
        vocab_size=arch.vocab_size,
        padded_vocab_size=arch.padded_vocab_size(tp),
        make_vocab_size_divisible_by=128,
        max_position_embeddings=arch.max_position_embeddings,
        seq_length=min(arch.max_position_embeddings, 4096),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        bf16=arch.dtype == torch.bfloat16,
        fp16=arch.dtype == torch.float16,
        params_dtype=arch.dtype,
        hf_model_type=arch.model_type,
        hf_config=hf_config,
    )


def transformer_config(arch: ModelArch, *, tp: int = 1, pp: int = 1,
                       dtype: torch.dtype | None = None, **overrides):
    """A Megatron ``TransformerConfig`` for this architecture (no dropout, RMSNorm, SwiGLU)."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    dtype = dtype or arch.dtype
    # Megatron's torch.compile'd fusions (SwiGLU, bias-dropout-add) pay off on GPU; on CPU they
    # would only add compile time to every test.
    fuse = torch.cuda.is_available()
    kwargs = dict(
        **_megatron_sizes(arch),
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=fuse,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=fuse,
        apply_rope_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        sequence_parallel=False,
        pipeline_dtype=dtype if pp > 1 else None,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)
