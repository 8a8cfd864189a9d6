"""Load HF-named tensors (safetensors files, or any (name, tensor) stream) into CausalLM.

The same `load_named_tensors` serves the initial load and every weight update (disk, tensor,
distributed), so all paths map names identically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors import safe_open

from ..models.causal_lm import CausalLM


def safetensors_files(model_dir: str | Path) -> list[Path]:
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {d}")
    return files


def iter_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    for f in safetensors_files(model_dir):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


def checkpoint_dtype(model_dir: str | Path) -> torch.dtype:
    """dtype of the first floating tensor, for checkpoints whose config names none."""
    for _, t in iter_safetensors(model_dir):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def _targets(model: CausalLM, name: str) -> tuple[torch.Tensor, slice | None] | None:
    """The parameter an HF tensor goes to, and the row block inside a fused matrix."""
    name = name.removeprefix("model.")
    cfg = model.cfg
    if name == "embed_tokens.weight":
        return model.embed_tokens.weight, None
    if name == "norm.weight":
        return model.norm.weight, None
    if name == "lm_head.weight":
        return (model.lm_head.weight, None) if model.lm_head is not None else None
    parts = name.split(".")
    if parts[0] != "layers":
        raise KeyError(name)
    layer = model.layers[int(parts[1])]
    rest = ".".join(parts[2:])
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    inter = cfg.intermediate_size
    fused = {
        "self_attn.q_proj": (layer.self_attn.qkv_proj, slice(0, q)),
        "self_attn.k_proj": (layer.self_attn.qkv_proj, slice(q, q + kv)),
        "self_attn.v_proj": (layer.self_attn.qkv_proj, slice(q + kv, q + 2 * kv)),
        "mlp.gate_proj": (layer.mlp.gate_up_proj, slice(0, inter)),
        "mlp.up_proj": (layer.mlp.gate_up_proj, slice(inter, 2 * inter)),
    }
    module_name, _, pname = rest.rpartition(".")
    if module_name in fused:
        module, rows = fused[module_name]
        return getattr(module, pname), rows
    return layer.get_parameter(rest), None


def safetensors_shapes(model_dir: str | Path) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes from the file headers, without reading the data."""
    out = []
    for f in safetensors_files(model_dir):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            out += [(name, tuple(fh.get_slice(name).get_shape())) for name in fh.keys()]
    return out


def _destination(model: CausalLM, name: str) -> torch.Tensor | None:
    """The model tensor (or row slice of a fused one) an HF weight goes to; None = not stored
    (rotary buffers, lm_head of a tied model, whose head is the embedding)."""
    if "rotary_emb" in name:
        return None
    try:
        target = _targets(model, name)
    except (KeyError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"unexpected weight name {name!r}") from e
    if target is None:
        return None
    param, rows = target
    return param if rows is None else param[rows]


def validate_shapes(model: CausalLM, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """Check every name and shape before any copy, so a bad update changes nothing."""
    for name, shape in shapes:
        dst = _destination(model, name)
        if dst is not None and tuple(shape) != tuple(dst.shape):
            raise ValueError(f"shape mismatch for {name}: got {tuple(shape)}, "
                             f"expected {tuple(dst.shape)}")


@torch.no_grad()
def load_named_tensors(model: CausalLM, named: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy tensors into the model (casting dtype and device). Returns how many were loaded."""
    count = 0
    for name, tensor in named:
        dst = _destination(model, name)
        if dst is None:
            continue
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for {name}: got {tuple(tensor.shape)}, "
                             f"expected {tuple(dst.shape)}")
        dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))
        count += 1
    return count
