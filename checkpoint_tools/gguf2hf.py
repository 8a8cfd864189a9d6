"""GGUF -> Hugging Face checkpoint: safetensors weights, tokenizer with its chat template, config.

    python -m checkpoint_tools.gguf2hf --gguf SmolLM2-135M-Instruct.Q4_1.gguf --output-dir models/SmolLM2 [--dtype bfloat16]

transformers reads the GGUF (``gguf_file=``, needs the ``gguf`` package) and dequantizes every
tensor; the weights are then saved through a fresh model of the same architecture, without the
GGUF ``quantization_config``, so the result is a plain HF checkpoint that every tool here (the
engine, hf2megatron, the trainer) loads like any other. Quantized weights are dequantized
exactly; the conversion cannot restore the precision quantization took away.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import gguf2hf_args

if __name__ == "__main__":  # --help and flag errors before torch loads
    gguf2hf_args(description=__doc__.split("\n\n")[0])

import torch  # noqa: E402

from .model_config import CheckpointError, run_converter  # noqa: E402

# GGUF architecture -> what transformers builds from it (families this project trains)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# tensor types transformers/gguf dequantize
TENSOR_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                "Q5_K", "Q6_K"}


def inspect_gguf(path: Path) -> tuple[str, dict[str, int]]:
    """The file's architecture and how many tensors of each type it holds; errors name the file."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError("reading GGUF needs the 'gguf' package (pip install gguf)") from None
    if not path.is_file():
        raise CheckpointError(f"--gguf {path}: file not found")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise CheckpointError(f"--gguf {path}: not a readable GGUF file ({e})") from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise CheckpointError(f"--gguf {path}: no general.architecture in its metadata")
    arch = bytes(field.parts[field.data[0]]).decode()
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return arch, types


def check_supported(path: Path, arch: str, types: dict[str, int]) -> None:
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"--gguf {path}: architecture {arch!r} is not supported "
                              f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    bad = sorted(set(types) - TENSOR_TYPES)
    if bad:
        raise CheckpointError(f"--gguf {path}: tensor type(s) {', '.join(bad)} cannot be dequantized "
                              f"here (supported: {', '.join(sorted(TENSOR_TYPES))})")


def _load(path: Path, what: str, fn):
    try:
        return fn(str(path.parent), gguf_file=path.name)
    except (ValueError, RuntimeError, KeyError, OSError) as e:
        raise CheckpointError(f"--gguf {path}: transformers could not read its {what}: {e}") from None


def convert(gguf_path: str | Path, output_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the HF checkpoint of ``gguf_path`` into ``output_dir``; returns ``output_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path, out = Path(gguf_path), Path(output_dir)
    arch, types = inspect_gguf(path)
    check_supported(path, arch, types)
    tokenizer = _load(path, "tokenizer", AutoTokenizer.from_pretrained)
    gguf_model = _load(path, "weights", lambda d, **kw: AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, **kw))
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain tensors
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None) -> int:
    args = gguf2hf_args(argv, description=__doc__.split("\n\n")[0])
    return run_converter("gguf2hf", lambda: convert(
        args.gguf, args.output_dir, getattr(torch, args.dtype)))


if __name__ == "__main__":
    sys.exit(main())
