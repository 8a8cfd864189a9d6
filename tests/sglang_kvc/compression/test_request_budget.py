"""A request's own budget (`compress_budget`, what the trainer's adaptive budget sends): each
request of one batch compresses to its B, reports it, and is admitted by its own bound."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.io_struct import parse_generate

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def make_engine(tiny_models, **kw):
    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", **kw)


def streaming_evict_at(P, total, B, N, sinks):
    """Independent reference: StreamingLLM's held list replayed token by token at budget B."""
    evict, held = [total] * total, list(range(P))
    for i in range(P, total - 1):
        held.append(i)
        if len(held) >= B + N:
            keep = held[:sinks] + held[len(held) - (B - sinks):]
            for k in set(held) - set(keep):
                evict[k] = i + 1
            held = keep
    return evict


@pytest.mark.parametrize("keep_prompt", [False, True])
def test_each_request_compresses_to_its_own_budget(tiny_models, keep_prompt):
    N, M, P = 4, 40, 10
    budgets = [None, 8, 20]  # None: the server's 12
    sizes = {}  # rid -> kv_len after every compaction
    with make_engine(tiny_models, compress_algorithm="snapkv", compress_max_prompt=12,
                     compress_divide_length=N, compress_max_window=3,
                     compress_keep_prompt=keep_prompt, max_total_tokens=200) as eng:
        compress = eng.compressor.compress

        def spy(seqs):
            out = compress(seqs)
            for s in seqs:
                sizes.setdefault(s.rid, set()).add(s.kv_len)
            return out

        eng.compressor.compress = spy
        items, _ = parse_generate({"input_ids": [prompt(P, i) for i in range(3)],
                                   "sampling_params": dict(GREEDY, max_new_tokens=M),
                                   "compress_budget": budgets}, eng.sampling_defaults)
        outs = [f.result() for f in eng.submit(items)]
        assert eng.scheduler.num_preemptions == 0
    pinned = P if keep_prompt else 0
    for out, b in zip(outs, budgets):
        c, B = out["meta_info"]["compression"], b or 12
        assert c["budget"] == B and c["dense"] is False
        assert sizes[out["meta_info"]["id"]] == {pinned + B}
        assert c["peak_kv_slots"] == pinned + B + N
        assert c["tokens_evicted"] == c["num_compressions"] * N > 0


def test_streamingllm_record_follows_the_request_budget(tiny_models):
    P, N, M, S = 9, 5, 36, 2
    with make_engine(tiny_models, compress_algorithm="streamingllm", compress_max_prompt=20,
                     compress_divide_length=N, compress_max_window=2, compress_num_sink=S) as eng:
        outs = eng.generate(input_ids=[prompt(P), prompt(P)], return_eviction_record=True,
                            sampling_params=dict(GREEDY, max_new_tokens=M), compress_budget=[7, 10])
    for out, B in zip(outs, (7, 10)):
        rec = out["meta_info"]["eviction_record"]
        want = torch.tensor(streaming_evict_at(P, P + M, B, N, S), dtype=rec.dtype)
        assert torch.equal(rec, want.expand_as(rec))


def test_bad_budgets_fail_and_dense_requests_ignore_it(tiny_models):
    with make_engine(tiny_models, compress_algorithm="streamingllm", compress_max_prompt=16,
                     compress_max_window=4, compress_num_sink=4) as eng:
        for bad, msg in ((4, "larger than the window"), (7, "compress-num-sink"),
                         (True, "positive integer"), (0, "positive integer")):
            with pytest.raises(ValueError, match=msg):
                eng.generate(input_ids=prompt(5), compress_budget=bad)
        out = eng.generate(input_ids=prompt(30), compress=False, compress_budget=8,
                           sampling_params=dict(GREEDY, max_new_tokens=10))
        c = out["meta_info"]["compression"]
        assert c["dense"] is True and c["budget"] is None and c["num_compressions"] == 0
    with make_engine(tiny_models) as dense:  # no compression: nothing to budget
        assert "compression" not in dense.generate(input_ids=prompt(5), compress_budget=3,
                                                   sampling_params=dict(GREEDY, max_new_tokens=2)
                                                   )["meta_info"]
