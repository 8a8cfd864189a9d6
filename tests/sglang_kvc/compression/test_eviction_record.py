"""The eviction record (`return_eviction_record`): per layer, KV head and key, the first query
position that no longer sees the key. Checked against the StreamingLLM kept sets recomputed from
the trigger rule, against the engine's own held-slot counts for R-KV / SnapKV, and over HTTP."""

from __future__ import annotations

import pytest
import requests
import torch

from sglang_kvc.compression import eviction_record
from sglang_kvc.engine.engine import Engine

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def make_engine(tiny_models, **kw):
    return Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", **kw)


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n,), generator=g).tolist()


def streaming_evict_at(P, total, B, N, sinks, compress_prompt):
    """Independent reference: replay the held list of StreamingLLM token by token."""
    evict = [total] * total
    held = list(range(P))

    def squeeze(h, at):
        keep = h[:sinks] + h[len(h) - (B - sinks):]
        for k in set(h) - set(keep):
            evict[k] = at
        return keep

    if compress_prompt and len(held) > B:
        held = squeeze(held, P)
    for i in range(P, total - 1):  # the query at i feeds token i; compression after its step
        held.append(i)
        if len(held) >= B + N:
            held = squeeze(held, i + 1)
    return evict


def visible(record: torch.Tensor) -> torch.Tensor:
    """[L, H, T, T] bool: query q sees key k."""
    T = record.shape[-1]
    q = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    return (k <= q) & (q < record[..., None, :].long())


@pytest.mark.parametrize("P,compress_prompt", [(9, False), (22, True), (22, False)])
def test_streamingllm_record_matches_the_trigger_replay(tiny_models, P, compress_prompt):
    B, N, S, M = 12, 6, 4, 30
    with make_engine(tiny_models, compress_algorithm="streamingllm", compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=2, compress_num_sink=S,
                     compress_prompt=compress_prompt) as eng:
        out = eng.generate(input_ids=prompt(P), sampling_params=dict(GREEDY, max_new_tokens=M),
                           return_eviction_record=True)
    rec = out["meta_info"]["eviction_record"]
    L, H = eng.model_config.num_layers, eng.model_config.num_kv_heads
    assert rec.shape == (L, H, P + M) and rec.dtype == torch.int16
    want = torch.tensor(streaming_evict_at(P, P + M, B, N, S, compress_prompt), dtype=torch.int16)
    assert torch.equal(rec, want.expand(L, H, P + M))
    assert out["meta_info"]["eviction_record_exact"] is True
    assert (rec < P + M).sum() > 0


@pytest.mark.parametrize("algo,selection", [("rkv", "head"), ("snapkv", "layer"), ("rkv", "layer")])
def test_record_rebuilds_the_engines_held_sets(tiny_models, algo, selection):
    """Every decode query sees exactly as many keys as the engine held at that step, the newest
    w always, and with per-layer selection every KV head of a layer the same set."""
    B, N, w, P, M = 10, 5, 3, 14, 40
    seen = []  # (position fed next, kv_len) after every step
    with make_engine(tiny_models, compress_algorithm=algo, compress_max_prompt=B,
                     compress_divide_length=N, compress_max_window=w, compress_prompt=True,
                     compress_selection=selection) as eng:
        after_step = eng.runner.after_step

        def watch(batch):
            after_step(batch)
            seen.extend((s.num_computed, s.kv_len) for s in batch.seqs)

        eng.runner.after_step = watch
        out = eng.generate(input_ids=prompt(P, seed=3),
                           sampling_params=dict(GREEDY, max_new_tokens=M),
                           return_eviction_record=True)
    rec = out["meta_info"]["eviction_record"]
    vis = visible(rec)
    assert out["meta_info"]["compression"]["num_compressions"] >= 4
    for q, held in seen:  # the query at q sees the held keys plus its own
        if q < P + M:
            assert (vis[..., q, :].sum(-1) == held + 1).all(), q
            assert vis[..., q, q - w:q + 1].all()
    assert (vis[..., P - 1, :P]).all()  # the last prompt query saw the whole prompt
    per_head_differs = (rec[:, :1] != rec).any()
    assert bool(per_head_differs) == (selection == "head")


def test_record_is_off_by_default_and_never_on_dense_requests(tiny_models):
    with make_engine(tiny_models, compress_algorithm="snapkv", compress_max_prompt=8,
                     compress_divide_length=4, compress_max_window=2) as eng:
        ids = prompt(12)
        plain = eng.generate(input_ids=ids, sampling_params=dict(GREEDY, max_new_tokens=10))
        dense = eng.generate(input_ids=ids, sampling_params=dict(GREEDY, max_new_tokens=10),
                             compress=False, return_eviction_record=True)
    assert "eviction_record" not in plain["meta_info"]
    assert (dense["meta_info"]["eviction_record"] == 22).all()
    with pytest.raises(ValueError, match="return_eviction_record must be a boolean"):
        eng.generate(input_ids=ids, return_eviction_record="yes")


def test_record_over_http_is_base64_of_the_same_tensor(serve):
    srv = serve("qwen2.5", compress_algorithm="rkv", compress_max_prompt=8,
                compress_divide_length=4, compress_max_window=2)
    body = {"input_ids": prompt(11), "sampling_params": dict(GREEDY, max_new_tokens=20),
            "return_eviction_record": True}
    got = requests.post(srv.url + "/generate", json=body, timeout=60).json()
    enc = got["meta_info"]["eviction_record"]
    assert enc["dtype"] == "int16" and enc["shape"][-1] == 31
    want = srv.engine.generate(**{k: v for k, v in body.items() if k != "sampling_params"},
                               sampling_params=body["sampling_params"])
    assert torch.equal(eviction_record.decode(enc), want["meta_info"]["eviction_record"])
    bad = requests.post(srv.url + "/generate", json=dict(body, return_eviction_record=1), timeout=60)
    assert bad.status_code == 400 and "return_eviction_record" in bad.text


def test_size_at_4k_tokens_for_the_half_b_shape():
    # Qwen2.5-0.5B: 24 layers, 2 KV heads; 4096 positions fit int16
    assert eviction_record.record_bytes(24, 2, 4096) == 24 * 2 * 4096 * 2 == 393216
    r = torch.randint(0, 4096, (24, 2, 4096), dtype=torch.int16)
    enc = eviction_record.encode(r)
    assert len(enc["data"]) == 524288 and torch.equal(eviction_record.decode(enc), r)
    assert eviction_record.record_dtype(40000) == torch.int32


def test_tracker_on_a_hand_worked_example():
    """Prompt 0..5; compaction at 6 keeps rows [0, 2, 4, 5] of head 0 and [1, 3, 4, 5] of head 1;
    positions 6, 7 are appended; compaction at 8 keeps rows [0, 4, 5] (head 0: positions 0, 6, 7)
    and [1, 4, 5] (head 1: 3, 6, 7)."""
    t = eviction_record.EvictionTracker(1, 2)
    t.on_compact(torch.tensor([[[0, 2, 4, 5], [1, 3, 4, 5]]]), 6, 6)
    assert t.positions(6, "cpu").tolist() == [[[0, 2, 4, 5, 6, 7], [1, 3, 4, 5, 6, 7]]]
    t.on_compact(torch.tensor([[[0, 4, 5], [1, 4, 5]]]), 6, 8)
    rec = t.finish(10)
    assert rec.tolist() == [[[10, 6, 8, 6, 8, 8, 10, 10, 10, 10],
                             [6, 8, 6, 10, 8, 8, 10, 10, 10, 10]]]
    assert t.exact
    t.on_reset(9)  # preempted: recomputed densely (all K/V anew) from query 9 on
    assert t.exact and t.dense_from == 9
    assert t.positions(3, "cpu").tolist() == [[[0, 1, 2], [0, 1, 2]]]
    t.on_reset(11)
    assert t.dense_from == 9  # dense from the first recompute on
    t.on_compact(torch.tensor([[[0, 1], [0, 1]]]), 3, 12)  # compressing again: not expressible
    assert not t.exact
    fresh = eviction_record.EvictionTracker(1, 2)
    fresh.on_reset(4)  # nothing evicted before the preemption: the plain record stays exact
    assert fresh.exact and fresh.dense_from is None


def _held_list_record(history, L, H, length):
    """Independent reference: each (layer, head)'s held positions as a Python list; a compaction
    keeps rows keep[l][h] (in that order) of the list, and the rest get evict_at = at; positions
    from `at` on are appended as the request feeds them."""
    evict = [[[length] * length for _ in range(H)] for _ in range(L)]
    held, fed = [[[] for _ in range(H)] for _ in range(L)], 0
    for keep, n, at in history:
        for l in range(L):
            for h in range(H):
                rows = held[l][h] + list(range(fed, fed + n - len(held[l][h])))
                kept = [rows[j] for j in keep[l][h]]
                for p in set(rows) - set(kept):
                    evict[l][h][p] = at
                held[l][h] = kept
        fed = at
    return evict


def test_group_update_equals_the_held_list_replay():
    """on_compact_group (the compressor's batched update) over requests with different
    histories in one event, some compacting for the first time and some again, at different
    `at`: every record equals the held-list replay of its own history."""
    L, H, length = 2, 3, 40
    g = torch.Generator().manual_seed(0)

    def keep(n, k):  # random kept rows per (layer, head), in a random order
        return torch.stack([torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(H)])
                            for _ in range(L)])

    trackers = [eviction_record.EvictionTracker(L, H) for _ in range(5)]
    history = [[] for _ in trackers]
    # event 1: requests 0-2 held 10 rows (positions 0-9) and keep 6, gone from query 10 on
    first = torch.stack([keep(10, 6) for _ in range(3)])
    eviction_record.on_compact_group(trackers[:3], first, 10, [10, 10, 10])
    for i in range(3):
        history[i].append((first[i].tolist(), 10, 10))
    # event 2: all five hold 9 rows (0-2: 6 kept + positions 10-12; 3-4: positions 0-8), keep 5
    second = torch.stack([keep(9, 5) for _ in range(5)])
    ats = [13, 13, 13, 9, 9]
    eviction_record.on_compact_group(trackers, second, 9, ats)
    for i, at in enumerate(ats):
        history[i].append((second[i].tolist(), 9, at))
    # event 3: a subset again, in another order (requests 4 and 1: 5 kept + 3 fed)
    third = torch.stack([keep(8, 4) for _ in range(2)])
    eviction_record.on_compact_group([trackers[4], trackers[1]], third, 8, [12, 16])
    history[4].append((third[0].tolist(), 8, 12))
    history[1].append((third[1].tolist(), 8, 16))
    for t, hist in zip(trackers, history):
        assert t.finish(length).tolist() == _held_list_record(hist, L, H, length)
        assert t.positions(5, "cpu").shape == (L, H, 5)


def preempt_after_compressions(eng, body, compressions=2):
    """Submit one request; once it compressed `compressions` times, stop its compression (as
    after </think>) and preempt it (it is recomputed densely when readmitted)."""
    import time

    from sglang_kvc.engine.io_struct import parse_generate

    items, _ = parse_generate(body, eng.sampling_defaults)
    fut = eng.submit(items)[0]
    running = eng.scheduler.running
    while not eng.loop.call(lambda: bool(running) and running[0].num_compressions >= compressions):
        time.sleep(0.001)

    def stop_and_preempt():
        seq = running[0]
        seq.compress_stopped = True
        eng.scheduler.retract_all()
        return len(seq.prompt_ids) + seq.num_sampled - 1  # its last sampled token's position

    return fut, eng.loop.call(stop_and_preempt)


def test_preemption_after_an_eviction_reports_where_the_dense_recompute_starts(tiny_models):
    with make_engine(tiny_models, compress_algorithm="rkv", compress_max_prompt=10,
                     compress_divide_length=5, compress_max_window=3) as eng:
        fut, resume_at = preempt_after_compressions(eng, {
            "input_ids": prompt(7, seed=5), "return_eviction_record": True,
            "sampling_params": dict(GREEDY, max_new_tokens=60)})
        out = fut.result()
    meta = out["meta_info"]
    assert meta["num_preemptions"] == 1 and meta["eviction_record_exact"] is True
    rec, dense_from = meta["eviction_record"], meta["eviction_record_dense_from"]
    assert 7 < dense_from == resume_at < 66 and (rec < 67).any()
    assert (rec[rec < 67] <= dense_from).all()  # every eviction happened before the recompute
