"""The whole-step CUDA-graph path (cuda_graph.DecodeGraphs) on the CPU, with capture and replay
emulated by calling the captured body: static buffers, padding entries, per-batch parameter
reloads, the warm-up's restore of the input tokens and output packing must give exactly the
eager engine's outputs. The GPU test (test_engine_gpu) replays real graphs."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.cuda_graph import DecodeGraphs

from .test_overlap import assert_same, make, request_mix, run_mix


class _Replay:
    def __init__(self, body, out):
        self.body, self.out = body, out

    def replay(self):
        self.out.copy_(self.body())


class EmulatedGraphs(DecodeGraphs):
    def _capture(self, gbs, mode):
        last = self.parts.rows.last_token
        saved = last.clone()
        warm = self._body(gbs, mode)  # as the real warm-up: runs the step, then restores inputs
        last.copy_(saved)
        g = _Replay(lambda: self._body(gbs, mode), torch.zeros_like(warm))
        self.graphs[(gbs, mode)] = (g, g.out)


@pytest.mark.parametrize("extra", [{}, {"compress_algorithm": "rkv", "compress_max_prompt": 12,
                                        "compress_divide_length": 4, "compress_max_window": 3}],
                         ids=["dense", "rkv"])
def test_graph_step_logic_matches_eager(tiny_models, extra):
    with make(tiny_models, overlap=True, **extra) as eng:
        mix = request_mix(eng)
        want = run_mix(eng, mix)
    with make(tiny_models, overlap=True, cuda_graph_max_bs=16, **extra) as eng:
        eng.runner.graphs = EmulatedGraphs(eng.runner.graph_parts(), 16)
        got = run_mix(eng, mix)
        sizes = {gbs for gbs, _ in eng.runner.graphs.graphs}
        modes = {mode for _, mode in eng.runner.graphs.graphs}
        stats = eng.runner.graphs.stats()
    assert_same(got, want, tol=1e-5)
    assert len(sizes) > 1 and len(modes) > 1  # padded sizes and sampling modes really varied
    assert stats["replays"] > stats["graphs"] > 0 and stats["replay_s"] > 0  # timed per replay


def test_steps_needing_a_capture_run_eagerly_while_the_gate_is_held(tiny_models):
    """Async training: while the trainer's thread holds CAPTURE_GATE (its GPU work must not
    overlap a capture), a step whose graph is missing leaves every buffer and request untouched
    and runs eagerly; once the gate is free the graphs are captured. Mixed eager and graphed
    steps give exactly the eager engine's outputs."""
    import threading
    import time

    from sglang_kvc.engine.cuda_graph import CAPTURE_GATE

    with make(tiny_models, overlap=True) as eng:
        mix = request_mix(eng)
        want = run_mix(eng, mix)
    with make(tiny_models, overlap=True, cuda_graph_max_bs=16) as eng:
        graphs = eng.runner.graphs = EmulatedGraphs(eng.runner.graph_parts(), 16)
        held = threading.Event()

        def trainer():  # holds the gate until the engine has deferred five steps
            with CAPTURE_GATE.device_work():
                held.set()
                deadline = time.monotonic() + 60
                while graphs.deferred < 5 and time.monotonic() < deadline:
                    time.sleep(0.001)

        worker = threading.Thread(target=trainer)
        worker.start()
        held.wait()
        got = run_mix(eng, mix)
        worker.join()
    assert graphs.deferred >= 5 and graphs.graphs  # both paths ran
    assert_same(got, want, tol=1e-5)


def test_capture_gate_is_exclusive():
    """A capture cannot start while another thread works on the device, and vice versa."""
    import threading

    from sglang_kvc.engine.cuda_graph import CaptureGate

    gate = CaptureGate()
    with gate.device_work():
        assert not gate.try_capture()
    assert gate.try_capture()
    got = []
    worker = threading.Thread(target=lambda: got.append(gate._lock.acquire(timeout=0.05)))
    worker.start()
    worker.join()
    assert got == [False]  # device_work (a blocking acquire) waits for the capture to end
    gate.end_capture()
    with gate.device_work():
        pass
