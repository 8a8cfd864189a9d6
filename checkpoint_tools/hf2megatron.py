"""HF safetensors -> Megatron-core ``torch_dist`` checkpoint, without building the model.

    python -m checkpoint_tools.hf2megatron --hf-checkpoint Qwen2.5-3B --save Qwen2.5-3B_torch_dist

Each HF tensor is read lazily, re-laid out (group-interleaved QKV, ``[gate; up]`` fc1, padded
vocab) and described to ``megatron.core.dist_checkpointing`` as a slice of the layer-stacked
global tensor Megatron itself would save (``decoder.layers.X`` with a leading layer axis), so the
result loads into any Megatron-core model (local or TE spec) at any TP/PP.
"""

from __future__ import annotations

import shutil
import sys
from argparse import Namespace
from pathlib import Path

from .cli import hf2megatron_args as parse_args

if __name__ == "__main__":  # --help and flag errors before torch and Megatron load
    parse_args()

import torch  # noqa: E402

from . import cpu_megatron  # noqa: E402
from .hf_io import HFCheckpointReader  # noqa: E402
from .mapping import (EMBEDDING, FINAL_NORM, HF_EMBEDDING, HF_FINAL_NORM, HF_LM_HEAD,  # noqa: E402
                      LAYER_PREFIX, OUTPUT_LAYER, hf_to_megatron_layer, pad_vocab)
from .model_config import (CheckpointError, load_arch, megatron_args, read_config_json,  # noqa: E402
                           run_converter)
from .torch_dist import METADATA, iteration_dir_name, write_tracker  # noqa: E402


# Megatron's linear layers (and TE's attention) save an ``_extra_state`` object per layer (fp8
# metadata under TE, None otherwise), and Megatron's loader asks for it: write the same empty
# objects so Megatron-LM / slime load these checkpoints as if Megatron had saved them.
EXTRA_STATE_MODULES = ("self_attention.linear_qkv", "self_attention.linear_proj",
                       "self_attention.core_attention", "mlp.linear_fc1", "mlp.linear_fc2")


def _sharded(key: str, tensor: torch.Tensor, layer: int | None = None, num_layers: int = 0,
             block: tuple[int, int] | None = None):
    """ShardedTensor for a whole tensor, or layer ``layer`` of a stack (optionally row block
    ``block = (index, count)`` of that layer, as Megatron's own SwiGLU fc1 shards are stored)."""
    from megatron.core.dist_checkpointing import ShardedTensor

    if layer is None:
        return ShardedTensor.from_rank_offsets(key, tensor, replica_id=0)
    offsets = [(0, layer, num_layers)] + ([(1, *block)] if block else [])
    return ShardedTensor.from_rank_offsets(key, tensor, *offsets, replica_id=0, prepend_axis_num=1)


def build_sharded_state_dict(reader: HFCheckpointReader, arch, padded_vocab: int,
                             dtype: torch.dtype | None = None) -> dict:
    """Megatron sharded state dict (TE-style keys, layer-stacked) over the HF tensors."""
    from megatron.core.dist_checkpointing import ShardedObject

    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    get = lambda name: cast(reader.get(name))  # noqa: E731
    state = {
        EMBEDDING: _sharded(EMBEDDING, pad_vocab(get(HF_EMBEDDING), padded_vocab)),
        FINAL_NORM: _sharded(FINAL_NORM, get(HF_FINAL_NORM)),
    }
    if not arch.tie_word_embeddings:
        state[OUTPUT_LAYER] = _sharded(OUTPUT_LAYER, pad_vocab(get(HF_LM_HEAD), padded_vocab))
    for i in range(arch.num_layers):
        for suffix, tensor in hf_to_megatron_layer(arch, get, i).items():
            name, key = f"{LAYER_PREFIX}{i}.{suffix}", LAYER_PREFIX + suffix
            if isinstance(tensor, tuple):  # fc1 (gate, up): written in place, never concatenated
                for b, part in enumerate(tensor):
                    state[f"{name}.block{b}"] = _sharded(key, part, i, arch.num_layers,
                                                         (b, len(tensor)))
            else:
                state[name] = _sharded(key, tensor, i, arch.num_layers)
        for module in EXTRA_STATE_MODULES:
            key = f"{LAYER_PREFIX}{module}._extra_state"
            state[f"{LAYER_PREFIX}{i}.{module}._extra_state"] = ShardedObject(
                key, None, (arch.num_layers,), (i,), replica_id=0)
    return state


def convert_hf_to_torch_dist(
    hf_dir: str | Path,
    save_dir: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    iteration: int | str = "release",
    padded_vocab_size: int | None = None,
    make_vocab_size_divisible_by: int = 128,
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert ``hf_dir`` into ``save_dir/<release|iter_N>``; return the iteration directory.

    ``tp`` only sets the vocab padding recorded in the checkpoint (Megatron's own rule); the
    checkpoint loads at any TP/PP.
    """
    hf_dir, save_dir = Path(hf_dir), Path(save_dir)
    config = read_config_json(hf_dir)
    arch = load_arch(hf_dir)
    reader = HFCheckpointReader(hf_dir)
    reader.validate(arch)
    padded = padded_vocab_size or arch.padded_vocab_size(tp, make_vocab_size_divisible_by)
    if padded < arch.vocab_size:
        raise CheckpointError(f"--padded-vocab-size {padded} is smaller than the vocab "
                              f"{arch.vocab_size}")

    out = save_dir / iteration_dir_name(iteration)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise CheckpointError(f"{out}: already exists and is not empty (pass --overwrite to "
                                  "replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    args = megatron_args(arch, tp=tp, pp=pp, hf_config=config)
    args.update(padded_vocab_size=padded, make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                hf_checkpoint=str(hf_dir), iteration=0 if iteration == "release" else int(iteration))
    if dtype is not None:
        args.update(params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16)
    from megatron.core import dist_checkpointing

    with cpu_megatron.single_process_group():
        state = {
            "model": build_sharded_state_dict(reader, arch, padded, dtype),
            "args": Namespace(**args),
            "checkpoint_version": 3.0,
            "iteration": args["iteration"],
        }
        dist_checkpointing.save(state, str(out))
    if not (out / METADATA).is_file():  # Megatron writes it last; absent means the save failed
        raise CheckpointError(f"{out}: save did not complete (no {METADATA})")
    write_tracker(save_dir, iteration)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_converter('hf2megatron', lambda: convert_hf_to_torch_dist(
        args.hf_checkpoint, args.save, tp=args.tp, pp=args.pp,
        iteration=args.iteration if args.iteration == "release" else int(args.iteration),
        padded_vocab_size=args.padded_vocab_size,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
        dtype=None if args.dtype == "auto" else getattr(torch, args.dtype),
        overwrite=args.overwrite))


if __name__ == "__main__":
    sys.exit(main())
