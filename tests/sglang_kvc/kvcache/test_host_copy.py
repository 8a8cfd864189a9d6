"""kvcache.host_copy.ints_to_device: the values and dtype of a list or numpy array of ints on
the device (a CPU here; the copy's asynchrony on CUDA is what the decode benchmarks' sync count
reads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_kvc.kvcache.host_copy import ints_to_device


@pytest.mark.parametrize("values", [[5, 0, 2**40, -3], np.array([[1, 2], [3, 4]], dtype=np.int32), []])
def test_values_shape_and_dtype(values):
    out = ints_to_device(values, "cpu")
    expected = torch.as_tensor(np.asarray(values, dtype=np.int64))
    assert out.dtype == torch.int64 and out.shape == expected.shape and torch.equal(out, expected)
    assert ints_to_device(values, torch.device("cpu"), torch.int32).dtype == torch.int32
    if isinstance(values, np.ndarray):  # dtype None: the array's own (the engine's int32 layouts)
        assert ints_to_device(values, "cpu", None).dtype == torch.int32
