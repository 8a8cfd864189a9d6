"""HF config -> Megatron GPT policy model (the trainer's model provider).

Transformer Engine's spec when TE is installed; otherwise Megatron's local spec with its naive
core attention swapped for ``SDPACoreAttention`` and RoPE fused (``fused_rope``). Weights come from a torch_dist checkpoint or,
for a Hugging Face directory, from an on-the-fly conversion (``checkpoint_tools.hf2megatron``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from checkpoint_tools.megatron_model import LayerModules, build_gpt_model, load_torch_dist
from checkpoint_tools.model_config import CheckpointError, load_arch
from checkpoint_tools.torch_dist import METADATA, TRACKER

from ..launch import launcher_free_env, phase
from .attention import SDPACoreAttention
from .fusions import rope as fused_rope
from .fusions.rmsnorm import FusedRMSNorm
from .settings import ModelConfig


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None and torch.cuda.is_available()


def layer_modules(backend: str = "auto") -> LayerModules:
    """The GPT layers' modules for ``backend``: ``te`` (Transformer Engine's spec); ``sdpa``
    (Megatron's local spec with SDPA attention and fused RMSNorm); ``local`` (unchanged);
    ``auto`` = TE if installed, else sdpa. ``checkpoint_tools.megatron_model`` builds them."""
    if backend == "auto":
        backend = "te" if transformer_engine_available() else "sdpa"
    if backend == "te":
        return LayerModules(transformer_engine=True)
    if backend == "local":
        return LayerModules()
    if backend != "sdpa":
        raise ValueError(f"unknown attention backend {backend!r} (auto, te, sdpa, local)")
    return LayerModules(core_attention=SDPACoreAttention, norm=FusedRMSNorm)


def default_dtype() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def rounds_checkpoint(cfg: ModelConfig) -> str | None:
    """Why the engines, loading ``hf_checkpoint`` themselves, would not serve the trainer's
    weights: the checkpoint is stored in another dtype than the trainer holds (an fp32 warm-up
    trained in bf16 loses its smallest steps to rounding), else None."""
    path = Path(cfg.hf_checkpoint) / "config.json"
    if cfg.load or not path.is_file():
        return None
    config = json.loads(path.read_text())
    stored = getattr(torch, str(config.get("dtype") or config.get("torch_dtype")), None)
    held = cfg.dtype or default_dtype()
    if not isinstance(stored, torch.dtype) or not _narrower(held, stored):
        return None
    return f"{cfg.hf_checkpoint} is stored in {stored}, the trainer holds {held}"


def _narrower(held: torch.dtype, stored: torch.dtype) -> bool:
    """Whether casting ``stored`` values to ``held`` can change them (bf16 -> fp32 cannot)."""
    if not (held.is_floating_point and stored.is_floating_point):
        return False
    return stored != held and torch.finfo(held).bits <= torch.finfo(stored).bits


def is_torch_dist_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / TRACKER).is_file() or (path / METADATA).is_file()


def resolve_weights(load: str | Path, hf_checkpoint: str | Path, cache_dir: str | Path) -> Path:
    """A torch_dist checkpoint to load: ``load`` itself, or ``load`` (an HF dir) converted once
    into ``cache_dir`` by rank 0 while the other ranks wait."""
    load = Path(load)
    if is_torch_dist_checkpoint(load):
        return load
    if not (load / "config.json").is_file():
        raise FileNotFoundError(f"--load {load}: neither a torch_dist checkpoint "
                                f"({TRACKER}) nor a Hugging Face model dir (config.json)")
    target = Path(cache_dir)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and not (target / TRACKER).is_file():
        with phase(f"HF -> torch_dist import of {load} into {target}"):
            _convert(load, target)
    if dist.is_initialized():
        dist.barrier()
    return target


def _convert(hf_dir: Path, target: Path) -> None:
    # A process of its own: the converter saves through torch.distributed, which must not
    # involve this job's process group; without the launcher's variables it cannot join it.
    env = {**launcher_free_env(), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "checkpoint_tools.hf2megatron", "--hf-checkpoint",
                           str(hf_dir), "--save", str(target), "--overwrite"], env=env)
    if proc.returncode != 0:
        raise CheckpointError(f"converting {hf_dir} to torch_dist failed (exit {proc.returncode}; "
                              f"its error is printed above)")


def build_policy_model(cfg: ModelConfig, *, cache_dir: str | Path | None = None, load: bool = True,
                       **config_overrides):
    """Build this rank's slice of the policy model and (optionally) load its weights: what to
    build and which weights are decided here first, then ``checkpoint_tools`` builds and loads
    (the calls go down, never back)."""
    modules, overrides = layer_modules(cfg.attention_backend), dict(config_overrides)
    if cfg.attention_backend != "local":
        fused_rope.install()
        overrides.setdefault("apply_rope_fusion", True)
    if cfg.recompute_activations:
        overrides.update(recompute_granularity="full", recompute_method="uniform",
                         recompute_num_layers=1)
    weights = _weights(cfg, cache_dir) if load else None
    arch = load_arch(cfg.hf_checkpoint)
    with phase(f"build {cfg.role} model") as info:
        model = build_gpt_model(arch, dtype=cfg.dtype or default_dtype(), modules=modules,
                                **overrides)
        info["detail"] = f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters on rank 0"
    if weights is not None:
        with phase(f"load {cfg.role} weights from {weights}"):
            load_torch_dist(model, weights)
    return arch, model


def _weights(cfg: ModelConfig, cache_dir: str | Path | None) -> Path:
    """The torch_dist checkpoint the policy loads (an HF ``--load`` imported once)."""
    source = cfg.load or cfg.hf_checkpoint
    cache = cache_dir or Path(source).with_name(Path(source).name + "_torch_dist")
    return resolve_weights(source, cfg.hf_checkpoint, cache)
