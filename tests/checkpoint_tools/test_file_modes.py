"""Checkpoints are shared data: safetensors files get the usual file mode (0644 under umask 022),
not the 0600 of safetensors' private temp file."""

from __future__ import annotations

import os

import torch

from checkpoint_tools.hf_io import ShardedSafetensorsWriter
from checkpoint_tools.tiny_models import make_tiny_model


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def test_written_shards_are_readable_by_all(tmp_path):
    writer = ShardedSafetensorsWriter(tmp_path, max_shard_bytes=64)
    for i in range(3):
        writer.add(f"w{i}", torch.zeros(16))
    files = writer.close()
    assert len(files) == 3
    assert {oct(os.stat(tmp_path / f).st_mode & 0o777) for f in files} == {oct(_default_mode())}


def test_save_pretrained_outputs_are_readable_by_all(tmp_path):
    out = make_tiny_model("qwen2.5", tmp_path / "m")
    assert os.stat(out / "model.safetensors").st_mode & 0o777 == _default_mode()
