"""The slot table and free list under batched extends and deferred frees, and the prefill's
token layout, against per-request hand-built references (the loops they replaced)."""

from __future__ import annotations

import numpy as np
import torch

from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.engine.step_io import extend_layout, prefill_layout


class Req:
    def __init__(self):
        self.row, self.kv_len, self.peak_kv = None, 0, 0


def make_cache(num_slots=64):
    pool = KVPool(num_slots, 2, 1, 4, torch.float32, torch.device("cpu"))
    return KVCache(pool, max_requests=6, max_len=40)


def test_batched_extend_writes_each_request_its_slots():
    kv = make_cache()
    reqs = [Req() for _ in range(3)]
    for r in reqs:
        kv.attach(r)
    kv.extend(reqs, [3, 1, 4])
    slots = kv.extend(reqs[::2], [2, 5])  # a second chunk for two of them, other order
    table = kv.req_to_token.table
    assert [r.kv_len for r in reqs] == [5, 1, 9]
    assert slots.tolist() == list(range(9, 16))  # the free list in order after 1..8
    assert table[reqs[0].row, :5].tolist() == [1, 2, 3, 9, 10]
    assert table[reqs[1].row, :2].tolist() == [4, 0]
    assert table[reqs[2].row, :9].tolist() == [5, 6, 7, 8, 11, 12, 13, 14, 15]


def test_deferred_frees_keep_order_and_counts():
    kv = make_cache(num_slots=16)
    reqs = [Req() for _ in range(3)]
    for r in reqs:
        kv.attach(r)
    kv.extend(reqs, [4, 3, 2])  # slots 1..9; 6 free (10..15)
    kv.release(reqs[1])  # 5, 6, 7
    kv.release(reqs[0])  # 1..4
    assert kv.num_free == 13
    assert kv.allocator.alloc(8).tolist() == [10, 11, 12, 13, 14, 15, 5, 6]
    assert kv.allocator.free_slots.tolist() == [7, 1, 2, 3, 4]
    kv.allocator.free(torch.tensor([9, 8]))
    assert kv.allocator.free_slots.tolist() == [7, 1, 2, 3, 4, 9, 8] and kv.num_free == 7


def test_freed_slots_are_copied():
    kv = make_cache(num_slots=8)
    given = torch.tensor([3, 4])
    kv.allocator.alloc(7)
    kv.allocator.free(given)
    given.fill_(0)  # the caller reuses its tensor before the list is read
    assert kv.allocator.free_slots.tolist() == [3, 4]


def test_prefill_layout_matches_per_token_lists():
    counts, first = [3, 1, 5, 2], [0, 7, 2, 40]
    positions, pad_index, pad_rows = prefill_layout(counts, first, torch.device("cpu"))
    ref_pos, ref_idx, ref_valid, offset = [], [], [], 0
    for n, p in zip(counts, first):
        ref_pos += list(range(p, p + n))
        ref_idx.append([offset + i if i < n else 0 for i in range(max(counts))])
        ref_valid.append([i < n for i in range(max(counts))])
        offset += n
    assert positions.tolist() == ref_pos and pad_index.tolist() == ref_idx
    # unpadding by pad_rows = by the boolean mask of valid entries
    padded = torch.randn(len(counts), max(counts), 3)
    assert torch.equal(padded.flatten(0, 1)[pad_rows], padded[torch.tensor(ref_valid)])
    flat = torch.randn(sum(counts), 3)  # pad then unpad: the flat tokens back, in order
    assert torch.equal(flat[pad_index].flatten(0, 1)[pad_rows], flat)


def test_extend_layout_matches_per_token_lists():
    """Requests 1 and 3 hold KV (7 and 2 slots): their queries and mask, built by hand per
    token; request 0 and 2 hold none and stay on the plain causal path."""
    counts, held, rows = [3, 4, 5, 2], [0, 7, 0, 2], [5, 6, 7, 8]
    e = extend_layout(counts, held, rows, torch.device("cpu"))
    starts = [0, 3, 7, 12]
    hit = [1, 3]
    lq, lk = 4, 11  # longest new run of the two, longest held + new
    assert e.rows.tolist() == [6, 8]
    assert e.q_index.tolist() == [[starts[i] + j if j < counts[i] else 0 for j in range(lq)]
                                  for i in hit]
    ref = [[[key <= held[i] + j and key < held[i] + counts[i] for key in range(lk)]
            for j in range(lq)] for i in hit]
    assert e.mask.shape == (2, 1, lq, lk) and e.mask[:, 0].tolist() == ref
    assert e.tokens.tolist() == [3, 4, 5, 6, 12, 13]
    assert e.pad_rows.tolist() == [0, 1, 2, 3, lq + 0, lq + 1]  # request e's j-th query: e*Lq+j
    # the paged kernel's layout: (row, first token, new, held) per request; one block each
    assert e.requests.tolist() == [[6, 8], [3, 12], [4, 2], [7, 2]]
    assert e.work.tolist() == [[0, 1], [0, 0]]
    assert extend_layout([3, 1], [0, 0], [1, 2], torch.device("cpu")) is None
    assert not e.every  # requests 0 and 2 take the plain causal pass
    every = extend_layout([2, 3], [4, 1], [1, 2], torch.device("cpu"))  # continuations only
    assert every.every and every.tokens.tolist() == [0, 1, 2, 3, 4]


def test_segments_by_hand_and_against_a_per_request_loop():
    from sglang_kvc.kvcache.kv_cache import segments

    seg, start, offset = segments([3, 0, 2])
    assert (seg.tolist(), start.tolist(), offset.tolist()) == ([0, 0, 0, 2, 2], [0, 3, 3], [0, 1, 2, 0, 1])
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 9, (40,), generator=gen).tolist()
    seg, start, offset = segments(counts)
    want = [(i, j) for i, c in enumerate(counts) for j in range(c)]
    assert list(zip(seg.tolist(), offset.tolist())) == want
    assert start.tolist() == [sum(counts[:i]) for i in range(len(counts))]
    assert seg.dtype == start.dtype == offset.dtype == np.int64


def test_host_to_device_views_keep_each_array():
    from sglang_kvc.engine.step_io import host_to_device

    a, b = np.arange(6).reshape(2, 3), np.array([7, 8, 9, 10])
    x, y = host_to_device([a, b], "cpu")
    assert x.tolist() == a.tolist() and y.tolist() == b.tolist() and x.shape == (2, 3)
