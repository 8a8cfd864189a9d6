"""Megatron ``torch_dist`` checkpoint layout: tracker file, iteration dirs, completeness, metadata.

    <save>/latest_checkpointed_iteration.txt      "release" or an iteration number
    <save>/release/ or <save>/iter_0000123/
        metadata.json    written last by Megatron: its presence marks a complete checkpoint
        common.pt        non-sharded state: args (argparse.Namespace), iteration, version, ...
        .metadata        PyTorch DCP metadata (global shapes, dtypes, chunk locations)
        __<rank>_<k>.distcp   shard payloads
"""

from __future__ import annotations

from pathlib import Path

import torch

from .model_config import CheckpointError

TRACKER = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
COMMON = "common.pt"


def iteration_dir_name(iteration: int | str) -> str:
    if iteration == "release":
        return "release"
    return f"iter_{int(iteration):07d}"


def write_tracker(save_dir: str | Path, iteration: int | str) -> None:
    """Point ``latest_checkpointed_iteration.txt`` at ``iteration`` (written after the checkpoint)."""
    tmp = Path(save_dir) / (TRACKER + ".tmp")
    tmp.write_text(str(iteration))
    tmp.replace(Path(save_dir) / TRACKER)


def read_tracker(save_dir: str | Path) -> str | None:
    path = Path(save_dir) / TRACKER
    return path.read_text().strip() if path.is_file() else None


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """Accept a ``--load`` root (with the tracker file) or an iteration dir; return the latter.

    Raises a ``CheckpointError`` naming the directory when the checkpoint is missing or was
    not completely written (no ``metadata.json``).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if (path / ".metadata").is_file() or (path / COMMON).is_file():
        ckpt = path
    else:
        iteration = read_tracker(path)
        if iteration is None:
            raise CheckpointError(
                f"{path}: not a Megatron torch_dist checkpoint (no {TRACKER} and no "
                f"{METADATA}/.metadata); pass the --save root or an iter_XXXXXXX/release dir")
        ckpt = path / (iteration if iteration == "release" else iteration_dir_name(iteration))
        if not ckpt.is_dir():
            raise CheckpointError(f"{path}/{TRACKER} points at {ckpt.name}, which does not exist")
    if not (ckpt / METADATA).is_file():
        raise CheckpointError(
            f"{ckpt}: no {METADATA}; the checkpoint is incomplete (a save was interrupted) or not "
            "a torch_dist checkpoint")
    return ckpt


def read_common(ckpt_dir: str | Path) -> dict:
    path = Path(ckpt_dir) / COMMON
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; the checkpoint's common state is needed")
    # common.pt holds an argparse.Namespace and plain Python values written by Megatron itself.
    return torch.load(path, map_location="cpu", weights_only=False)


def tensor_metadata(ckpt_dir: str | Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Global shape and dtype of every tensor stored in the checkpoint (from DCP ``.metadata``)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(ckpt_dir)).read_metadata()
    return {
        key: (tuple(m.size), m.properties.dtype)
        for key, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
