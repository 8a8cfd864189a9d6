"""The engine thread binds its engine's CUDA device before its first step (``bind_thread``):
the current CUDA device is per thread and a new thread starts on device 0, so rank 1's engine,
unbound, launched Triton kernels for cuda:1 tensors on cuda:0 and failed every step."""

from __future__ import annotations

import threading
import types

import torch

from sglang_kvc.engine import step_io
from sglang_kvc.engine.step_loop import StepLoop


def _idle_runner(device: torch.device):
    """Just enough of a ModelRunner for an idle step loop: a pool that is not allocated."""
    return types.SimpleNamespace(device=device,
                                 kv=types.SimpleNamespace(pool=types.SimpleNamespace(allocated=False)))


def test_engine_thread_binds_its_device_before_stepping(monkeypatch):
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: bound.append((threading.current_thread().name, torch.device(d))))
    loop = StepLoop(_idle_runner(torch.device("cuda", 1)), types.SimpleNamespace(add=None),
                    outputs=None, max_seq_len=8, overlap=True)
    # a command runs on the engine thread only after the loop started: the binding came first
    thread = loop.call(lambda: threading.current_thread().name)
    loop.stop()
    assert bound == [(thread, torch.device("cuda", 1))]
    assert thread != threading.current_thread().name


def test_cpu_engine_thread_binds_nothing(monkeypatch):
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    loop = StepLoop(_idle_runner(torch.device("cpu")), types.SimpleNamespace(add=None),
                    outputs=None, max_seq_len=8, overlap=True)
    loop.call(lambda: None)
    loop.stop()
    assert bound == []


def test_bare_cuda_resolves_to_the_current_device(monkeypatch):
    """``--device cuda`` means the device current when the engine is built (the trainer's rank
    device), fixed then: the engine thread binds that index, not whatever is current later."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert step_io.resolve_device("cuda") == torch.device("cuda", 3)
    assert step_io.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert step_io.resolve_device("cpu") == torch.device("cpu")
