"""Streaming access to HF safetensors checkpoints: read one tensor at a time, write in shards."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .mapping import HF_LM_HEAD, expected_hf_shapes
from .model_config import CheckpointError, ModelArch

SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = "model.safetensors"
# Files a converted HF directory takes from the original one (besides weights and config.json).
TOKENIZER_AND_GENERATION_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
    "chat_template.json",
)


class HFCheckpointReader:
    """Lazily reads tensors by name from a (possibly sharded) safetensors checkpoint.

    Tensors are memory-mapped and materialised one at a time, so converting a model never holds
    more than the tensors in flight.
    """

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        index = self.dir / SAFE_INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (self.dir / SAFE_SINGLE).is_file():
            with safe_open(self.dir / SAFE_SINGLE, "pt") as f:
                weight_map = {k: SAFE_SINGLE for k in f.keys()}
        else:
            raise CheckpointError(
                f"{self.dir}: no {SAFE_SINGLE} or {SAFE_INDEX} (only safetensors checkpoints are "
                "supported; convert .bin files with transformers' save_pretrained first)")
        self.weight_map: dict[str, str] = weight_map
        self._handles: dict[str, object] = {}

    def _handle(self, name: str):
        file = self.weight_map[name]
        if file not in self._handles:
            path = self.dir / file
            if not path.is_file():
                raise CheckpointError(f"{path}: listed in {SAFE_INDEX} but missing")
            self._handles[file] = safe_open(path, "pt")
        return self._handles[file]

    def names(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        if name not in self.weight_map:
            raise CheckpointError(f"{self.dir}: tensor {name!r} not found in the checkpoint")
        return self._handle(name).get_tensor(name)

    def dtype(self) -> torch.dtype:
        first = next(iter(self.weight_map))
        return self.get(first).dtype

    def validate(self, arch: ModelArch) -> None:
        """Every tensor the config implies exists with the shape the config implies."""
        expected = expected_hf_shapes(arch)
        for name, shape in expected.items():
            if name not in self.weight_map:
                raise CheckpointError(f"{self.dir}: tensor {name!r} is missing (config.json "
                                      f"implies it for model_type={arch.model_type})")
            actual = self.shape(name)
            if actual != shape:
                raise CheckpointError(
                    f"{self.dir}: tensor {name!r} has shape {list(actual)} but config.json implies "
                    f"{list(shape)}; the weights do not match the config")
        extra = [n for n in self.weight_map if n not in expected
                 and not (n == HF_LM_HEAD and arch.tie_word_embeddings)
                 and not n.endswith("rotary_emb.inv_freq")]
        if extra:
            raise CheckpointError(f"{self.dir}: unexpected tensors for this config: {extra[:5]}")


class ShardedSafetensorsWriter:
    """Writes tensors into ``model-0000k-of-0000n.safetensors`` shards of at most ``max_shard_bytes``.

    A model that fits in one shard is written as ``model.safetensors`` (as ``save_pretrained`` does).
    Tensors are flushed to disk as soon as a shard is full, so memory holds one shard at most.
    """

    def __init__(self, out_dir: str | Path, max_shard_bytes: int = 5 * 1024**3):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[str, list[str]]] = []  # (temporary file name, tensor names)
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous()
        self._pending_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        tmp = f".shard-{len(self._shards):05d}.safetensors.tmp"
        save_file(self._pending, self.dir / tmp, metadata={"format": "pt"})
        readable_by_all(self.dir / tmp)
        self._shards.append((tmp, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Finish the last shard, give shards their final names, write the index if sharded."""
        if self._pending:
            self._flush()
        n = len(self._shards)
        if n == 1:
            os.replace(self.dir / self._shards[0][0], self.dir / SAFE_SINGLE)
            return [SAFE_SINGLE]
        weight_map, files = {}, []
        for k, (tmp, names) in enumerate(self._shards):
            final = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            os.replace(self.dir / tmp, self.dir / final)
            weight_map.update({name: final for name in names})
            files.append(final)
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.dir / SAFE_INDEX).write_text(json.dumps(index, indent=2))
        return files


def read_all_tensors(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF directory (single-file or sharded), loaded into memory."""
    reader = HFCheckpointReader(hf_dir)
    return {name: reader.get(name) for name in reader.names()}


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Same names, dtypes and values, bit for bit."""
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    copied = []
    for name in TOKENIZER_AND_GENERATION_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


def readable_by_all(*paths: Path) -> None:
    """safetensors writes through a private temp file (mode 0600); a checkpoint is shared data,
    so give it the mode any other file gets here (0644 under the usual umask)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in paths:
        os.chmod(path, 0o666 & ~mask)


def fix_safetensors_modes(directory: str | Path) -> None:
    """`readable_by_all` for every .safetensors file `save_pretrained` wrote in `directory`."""
    readable_by_all(*Path(directory).glob("*.safetensors"))
