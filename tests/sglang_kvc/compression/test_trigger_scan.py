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

