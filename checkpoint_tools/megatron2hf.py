"""Megatron-core ``torch_dist`` checkpoint -> HF safetensors, one layer at a time.

    python -m checkpoint_tools.megatron2hf --load ckpt_root --output-dir hf_out \\
        [--origin-hf-dir Qwen2.5-3B] [--vocab-size 151936]

Reads the checkpoint without building a model or a process group: PyTorch DCP assembles each
layer-stacked tensor from whatever TP/PP chunks wrote it, one tensor kind at a time; the pieces
are converted to HF names and layouts and streamed into ``model-0000k-of-0000n.safetensors``
shards, so peak memory is about one stacked tensor plus one output shard. Vocab padding is trimmed; tied
embeddings write no ``lm_head``. Optimizer state in the checkpoint is never read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .cli import megatron2hf_args as parse_args

if __name__ == "__main__":  # --help and flag errors before torch loads
    parse_args()

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from .hf_io import SAFE_INDEX, ShardedSafetensorsWriter, copy_tokenizer_files  # noqa: E402
from .mapping import (EMBEDDING, FINAL_NORM, HF_EMBEDDING, HF_FINAL_NORM, HF_LM_HEAD,  # noqa: E402
                      LAYER_PREFIX, OUTPUT_LAYER, layer_suffixes, megatron_to_hf_tensor)
from .model_config import (CheckpointError, ModelArch, arch_from_hf_config,  # noqa: E402
                           read_config_json, run_converter)
from .torch_dist import read_common, resolve_checkpoint_dir, tensor_metadata  # noqa: E402

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _hf_config(ckpt: Path, origin_hf_dir: str | Path | None) -> dict:
    if origin_hf_dir is not None:
        return read_config_json(origin_hf_dir)
    args = read_common(ckpt).get("args")
    config = getattr(args, "hf_config", None)
    if not config:
        raise CheckpointError(
            f"{ckpt}: the checkpoint does not record its HF config (it was not written by "
            "hf2megatron or this trainer); pass --origin-hf-dir with the original HF model")
    return dict(config)


class _CheckpointLayout:
    """Where each Megatron tensor lives in this checkpoint: layer-stacked or per layer."""

    def __init__(self, ckpt: Path, arch: ModelArch):
        self.ckpt = ckpt
        self.arch = arch
        self.meta = tensor_metadata(ckpt)
        self.stacked = f"{LAYER_PREFIX}{layer_suffixes(arch)[1]}" in self.meta
        self._check()

    def layer_key(self, suffix: str, layer: int) -> str:
        return LAYER_PREFIX + suffix if self.stacked else f"{LAYER_PREFIX}{layer}.{suffix}"

    def _check(self) -> None:
        a = self.arch
        expect_rows = {EMBEDDING: None, FINAL_NORM: (a.hidden_size,)}
        for key, shape in expect_rows.items():
            if key not in self.meta:
                raise CheckpointError(f"{self.ckpt}: tensor {key!r} missing from the checkpoint")
            if shape is not None and self.meta[key][0] != shape:
                raise CheckpointError(f"{self.ckpt}: {key} has shape {list(self.meta[key][0])}, "
                                      f"config implies {list(shape)}")
        emb = self.meta[EMBEDDING][0]
        if emb[1] != a.hidden_size or emb[0] < a.vocab_size:
            raise CheckpointError(
                f"{self.ckpt}: {EMBEDDING} has shape {list(emb)}, but the config has hidden_size="
                f"{a.hidden_size} and vocab_size={a.vocab_size}; wrong --origin-hf-dir?")
        key = self.layer_key(layer_suffixes(a)[1], 0)
        if key not in self.meta:
            raise CheckpointError(f"{self.ckpt}: no decoder layer tensors ({key!r} missing)")
        if self.stacked and self.meta[key][0][0] != a.num_layers:
            raise CheckpointError(f"{self.ckpt}: checkpoint has {self.meta[key][0][0]} layers, "
                                  f"config has num_hidden_layers={a.num_layers}")
        for suffix in layer_suffixes(a):
            k = self.layer_key(suffix, 0)
            if k not in self.meta:
                raise CheckpointError(f"{self.ckpt}: tensor {k!r} missing; the checkpoint does not "
                                      f"match a {a.model_type} model with this config")

    def load(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """Read whole tensors by key with PyTorch DCP (any TP/PP chunking), without a process group."""
        import torch.distributed.checkpoint as dcp

        state = {k: torch.empty(self.meta[k][0], dtype=self.meta[k][1]) for k in keys}
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(self.ckpt)), no_dist=True)
        return state


def convert_torch_dist_to_hf(
    load: str | Path,
    output_dir: str | Path,
    *,
    origin_hf_dir: str | Path | None = None,
    vocab_size: int | None = None,
    max_shard_bytes: int = 5 * 1024**3,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write an HF model directory from a torch_dist checkpoint; return ``output_dir``."""
    ckpt = resolve_checkpoint_dir(load)
    config = _hf_config(ckpt, origin_hf_dir)
    if vocab_size is not None:
        config["vocab_size"] = vocab_size
    arch = arch_from_hf_config(config, source=f"config of {ckpt}")
    out = Path(output_dir)
    if out.exists() and any(out.glob("*.safetensors")) and not overwrite:
        raise CheckpointError(f"{out}: already holds safetensors files (pass --force to overwrite)")
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), out / SAFE_INDEX]:
        stale.unlink(missing_ok=True)

    writer = ShardedSafetensorsWriter(out, max_shard_bytes)
    layout = _CheckpointLayout(ckpt, arch)
    dtype = layout.meta[EMBEDDING][1]
    top = layout.load([EMBEDDING] + ([OUTPUT_LAYER] if OUTPUT_LAYER in layout.meta else []))
    writer.add(HF_EMBEDDING, top[EMBEDDING][: arch.vocab_size])
    if not arch.tie_word_embeddings:
        # an untied config whose checkpoint has no output layer was trained tied
        writer.add(HF_LM_HEAD, top.get(OUTPUT_LAYER, top[EMBEDDING])[: arch.vocab_size])
    del top
    # One Megatron tensor kind at a time (all layers of it), so memory holds one stack at most
    # besides the pending output shard.
    for suffix in tqdm(layer_suffixes(arch), desc="megatron2hf", disable=not progress, leave=False):
        if layout.stacked:
            stack = layout.load([layout.layer_key(suffix, 0)])[layout.layer_key(suffix, 0)]
            per_layer = list(stack.unbind(0))
            del stack
        else:
            keys = [layout.layer_key(suffix, i) for i in range(arch.num_layers)]
            loaded = layout.load(keys)
            per_layer = [loaded[k] for k in keys]
        for i, tensor in enumerate(per_layer):
            for name, hf_tensor in megatron_to_hf_tensor(arch, suffix, tensor, i).items():
                writer.add(name, hf_tensor)
        del per_layer
    writer.add(HF_FINAL_NORM, layout.load([FINAL_NORM])[FINAL_NORM])
    files = writer.close()

    config["dtype"] = _DTYPE_NAMES.get(dtype, "float32")
    config.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if origin_hf_dir is not None:
        copy_tokenizer_files(origin_hf_dir, out)
    if progress:
        print(f"megatron2hf: {len(files)} safetensors file(s), "
              f"{writer.total_bytes / 1e9:.2f} GB, dtype {config['dtype']}")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_converter('megatron2hf', lambda: convert_torch_dist_to_hf(
        args.load, args.output_dir, origin_hf_dir=args.origin_hf_dir,
        vocab_size=args.vocab_size, max_shard_bytes=int(args.chunk_size * 1024**3),
        overwrite=args.force))


if __name__ == "__main__":
    sys.exit(main())
