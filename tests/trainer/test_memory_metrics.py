"""Peak GPU memory per rollout in the metrics: read and reset on every call, absent on CPU."""

from __future__ import annotations

import pytest
import torch

from trainer.tracking import peak_memory_metrics

GIB = float(1 << 30)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case")
def test_no_memory_keys_without_cuda():
    assert peak_memory_metrics() == {}


class FakeCuda:
    """The allocator's peaks: each rollout allocates more, a reset forgets the last peak."""

    def __init__(self, peaks):
        self.peaks, self.resets = list(peaks), 0

    def max_memory_allocated(self, device=None):
        return self.peaks[self.resets] * GIB

    def max_memory_reserved(self, device=None):
        return (self.peaks[self.resets] + 1) * GIB

    def reset_peak_memory_stats(self, device=None):
        self.resets += 1


def test_peaks_are_read_and_reset_per_call(monkeypatch):
    fake = FakeCuda([3.0, 1.5])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    first, second = peak_memory_metrics(), peak_memory_metrics()
    assert first == {"memory/peak_allocated_gib": 3.0, "memory/peak_reserved_gib": 4.0,
                     "memory/peak_allocated_gib_max": 3.0, "memory/peak_reserved_gib_max": 4.0}
    assert second["memory/peak_allocated_gib"] == 1.5  # its own peak, not the first rollout's
    assert second["memory/peak_reserved_gib"] == 2.5 and fake.resets == 2
