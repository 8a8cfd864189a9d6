"""The compressor's per-step scan (Compressor._candidates) against the trigger it stands for:
after decode steps, the requests it groups for compaction are exactly those
`Trigger.should_compress` picks among all requests, for both divide methods, pinned prompts
and per-request budgets, as the requests grow step by step."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from sglang_kvc.compression.base import CompressionConfig
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence


def _requests(rng: random.Random, n: int) -> list[Sequence]:
    out = []
    for i in range(n):
        s = Sequence(f"r{i}", list(range(rng.randint(3, 30))), SamplingParams(max_new_tokens=500), seed=i)
        s.compress_budget = rng.choice([None, 20, 33])
        s.kv_len = rng.randint(0, 80)
        s.output_ids = [7, 8]
        s.num_computed = len(s.prompt_ids) + 2
        s.compress_stopped = rng.random() < 0.1
        out.append(s)
    return out


@pytest.mark.parametrize("method", ["step_length", "newline"])
@pytest.mark.parametrize("keep_prompt", [False, True])
def test_scan_picks_what_the_trigger_picks(method, keep_prompt):
    rng = random.Random(0)
    cfg = CompressionConfig("rkv", budget=24, window=4, divide_method=method, divide_length=9,
                            keep_prompt=keep_prompt, stop_after_think=False)
    trigger = Trigger(cfg, newline_ids={7})
    pool = SimpleNamespace(shape=(2, 1000, 2, 8), device="cpu")  # what chunking reads
    comp = Compressor(cfg, kv=SimpleNamespace(pool=pool), ring=None, trigger=trigger)
    picked: list = []
    comp.compress = lambda group: picked.extend(group)  # record, no KV to move
    seqs = _requests(rng, 60)
    for _ in range(40):
        picked.clear()
        want = [s for s in seqs if s.kv_len > trigger.floor(s) and trigger.should_compress(s, False)]
        comp.after_step(seqs, is_prefill=False)
        assert sorted(s.rid for s in picked) == sorted(s.rid for s in want)
        for s in seqs:  # one decode step; compacted requests drop back to their floor
            s.kv_len = trigger.floor(s) if s in want else s.kv_len + 1
            s.output_ids.append(rng.choice([7, 8]))
            s.num_computed += 1
    assert comp._fire_at  # the cached firing points were used


@pytest.mark.parametrize("device, scratch", [("cpu", 632 * 632), ("cuda", 0)])
def test_chunk_floats_per_request_hand_computed(device, scratch):
    """R-KV 512 + 128 at the 0.5B shape (24 layers, 2 KV heads of 64, 14 query heads, window 8):
    a request's keys (gathered + fp32), its m x m similarity matrix on the torch path only (the
    Triton pass on CUDA holds none), 8 score rows, and per layer the window's importance logits
    and softmax. On CUDA a round of 256 requests is scored in 8 chunks of <= 35, not 24 of 11."""
    cfg = CompressionConfig("rkv", budget=512, window=8, divide_length=128)
    pool = SimpleNamespace(shape=(24, 1000, 2, 64), device=device)
    ring = SimpleNamespace(buf=SimpleNamespace(shape=(24, 10, 8, 14, 64)))  # [L, rows, w, Hq, D]
    comp = Compressor(cfg, kv=SimpleNamespace(pool=pool), ring=ring, trigger=Trigger(cfg))
    n, m = 640, 632
    want = 24 * (2 * (scratch + 2 * n * 64 + 8 * m) + 2 * 14 * 8 * m)
    assert comp._elems_per_request(n) == want
    if device == "cuda":
        assert comp.chunk_elems // want == 35 and -(-256 // 35) == 8
    streaming = Compressor(CompressionConfig("streamingllm", budget=512, window=8, divide_length=128),
                           kv=SimpleNamespace(pool=pool), ring=None, trigger=Trigger(cfg))
    assert streaming._elems_per_request(n) == 24 * 2 * (2 * n * 64 + 8 * m)  # no queries
