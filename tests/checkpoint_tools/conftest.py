"""Helpers shared by the checkpoint_tools tests (read with safetensors directly, not our code)."""

import pytest
import torch
from safetensors import safe_open


def load_all_tensors(hf_dir):
    """Every tensor of an HF dir, whether single-file or sharded."""
    tensors = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    return tensors


def assert_identical(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


@pytest.fixture
def same_weights():
    """``same_weights(dir_a, dir_b)`` asserts two HF dirs hold bit-identical tensors."""
    return lambda a, b: assert_identical(load_all_tensors(a), load_all_tensors(b))


@pytest.fixture
def hf_tensors():
    return load_all_tensors
