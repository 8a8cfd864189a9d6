"""Prefills whose every request holds KV, replayed as CUDA graphs (prefill_graph.py), against the
same engine with them off (the paged kernel eagerly) and with the paged kernel off (the torch
gather + masked SDPA path): the same tokens, log-probs up to summation order (fp32). Then the
graphs across a weights release/resume (dropped, captured again, same outputs)."""

from __future__ import annotations

import pytest
import torch

from .test_prefill_graph_logic import _workload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _engine(tiny_models, **kw):
    from sglang_kvc.engine.engine import Engine

    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cuda", dtype="float32",
                  max_total_tokens=1 << 14, **kw)


def _assert_same(got, want, tol):
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, abs=tol)


def test_graphed_prefills_equal_eager_kernel_and_torch_path(tiny_models, monkeypatch):
    from sglang_kvc.layers import attention

    with _engine(tiny_models) as eng:
        graphed = _workload(eng)
        stats = eng.get_server_info()["prefill_graphs"]
    with _engine(tiny_models, prefill_graph_max_tokens=0) as eng:
        assert eng.runner.prefill_graphs is None
        eager = _workload(eng)
    monkeypatch.setattr(attention, "_paged_extend", False)
    with _engine(tiny_models) as eng:
        torch_path = _workload(eng)
        assert eng.get_server_info()["prefill_graphs"]["replays"] == 0  # the kernel off: eager
    assert stats["replays"] >= 3 and stats["graphs"] >= 2 and stats["captures"] == stats["graphs"]
    _assert_same(graphed, eager, 1e-4)
    _assert_same(graphed, torch_path, 1e-4)


def test_prefill_graphs_across_a_weights_release(tiny_models):
    with _engine(tiny_models) as eng:
        first = _workload(eng)
        captures = eng.get_server_info()["prefill_graphs"]["captures"]
        eng.release_memory(["weights"])
        eng.resume_memory(["weights"])
        again = _workload(eng)
        info = eng.get_server_info()["prefill_graphs"]
    assert info["captures"] > captures  # the weights moved: the graphs were dropped, captured again
    _assert_same(again, first, 1e-5)
