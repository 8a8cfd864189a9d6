"""The KV ownership invariant (kvcache/ownership.py) on a hand-driven KVCache: clean histories
pass with hand-counted `used`; a double free, a leak and a wrong prefix head are each caught.
Includes the copy-on-write compaction of a row whose cached prefix reaches past the pinned
prompt (issue 66: it used to set prefix_len to 0 with row[:P] still the cache's slots)."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.kvcache.ownership import KVOwnershipError, check


class Req:
    def __init__(self, rid, prompt):
        self.rid, self.prompt_ids = rid, list(prompt)
        self.row, self.kv_len, self.prefix_len, self.prefix_node = None, 0, 0, None
        self.num_computed = self.cached_tokens = self.peak_kv = 0


def make_cache(num_slots=64):
    pool = KVPool(num_slots, 2, 1, 4, torch.float32, torch.device("cpu"))
    return KVCache(pool, max_requests=6, max_len=40, prefix_cache=True)


def used(kv):
    return kv.capacity - kv.num_free


def prefill(kv, req):
    """Admit with the cache's match, compute the rest, cache the prompt (the engine's order)."""
    kv.attach(req, kv.match(req.prompt_ids))
    kv.extend([req], [len(req.prompt_ids) - req.kv_len])
    kv.cache_prompt(req)


def compact_tail(kv, req, offset, k):
    """Keep the first k entries of row[offset:kv_len] (the compactor's call, keep_idx fixed)."""
    slots = kv.req_to_token.table[req.row, offset:req.kv_len].long()[None]
    keep = torch.arange(k).expand(1, 2, 1, k)
    kv.compact([req], slots, keep, offset=offset)


def test_cow_past_the_pinned_prompt_keeps_the_head_shared():
    kv = make_cache()
    first = Req("a", range(10, 20))  # the pinned first prompt, P = 10
    prefill(kv, first)
    cont = Req("b", list(range(10, 20)) + list(range(50, 62)))  # a recomputed continuation
    prefill(kv, cont)
    kv.extend([cont], [3])  # decoded tokens
    check(kv, [first, cont])
    assert cont.prefix_len == 22 and used(kv) == 22 + 3
    compact_tail(kv, cont, offset=10, k=5)  # keep-prompt: row[10:25] -> 5 entries
    check(kv, [first, cont])
    assert cont.prefix_len == 10 and cont.kv_len == 15
    # the head still reads the cache's slots (first's), the 5 kept entries are its own
    table = kv.req_to_token.table
    assert torch.equal(table[cont.row, :10], table[first.row, :10])
    assert used(kv) == 10 + 5  # the context's cached tail (10..21) is now evictable
    kv.release(cont)
    kv.release(first)
    check(kv, [])
    assert used(kv) == 0 and kv.prefix.cached_tokens == 22 and kv.prefix.evictable == 22


def test_cow_with_nothing_pinned_drops_the_lock():
    kv = make_cache()
    req = Req("a", range(10, 22))
    prefill(kv, req)
    kv.extend([req], [4])
    compact_tail(kv, req, offset=0, k=6)
    check(kv, [req])
    assert req.prefix_node is None and req.prefix_len == 0 and used(kv) == 6
    kv.release(req)
    check(kv, [])
    assert used(kv) == 0


def test_cow_after_a_flush_frees_the_detached_tail_once():
    kv = make_cache()
    req = Req("a", range(10, 30))
    prefill(kv, req)
    kv.extend([req], [2])
    kv.flush()  # the tree is dropped; the request still reads its (detached) path
    check(kv, [req])
    compact_tail(kv, req, offset=8, k=4)
    check(kv, [req])
    assert req.prefix_len == 8 and used(kv) == 12
    kv.release(req)
    check(kv, [])
    assert used(kv) == 0 and kv.allocator.num_free == kv.capacity


def test_a_double_free_is_caught():
    kv = make_cache()
    req = Req("a", range(10, 20))
    prefill(kv, req)
    kv.allocator.free(kv.req_to_token.table[req.row, :3].long())  # the cache's slots, again
    with pytest.raises(KVOwnershipError, match="2 owners.*free list.*prefix cache"):
        check(kv, [req])


def test_a_leak_and_a_wrong_head_are_caught():
    kv = make_cache()
    kv.allocator.alloc(2)  # nobody owns them
    with pytest.raises(KVOwnershipError, match="none \\(leaked\\)"):
        check(kv, [])
    kv = make_cache()
    req = Req("a", range(10, 20))
    prefill(kv, req)
    req.prefix_len = 4  # the head no longer matches its node's path
    with pytest.raises(KVOwnershipError, match="prefix_len 4"):
        check(kv, [req])


def test_an_unlocked_read_is_caught():
    kv = make_cache()
    req = Req("a", range(10, 20))
    prefill(kv, req)
    kv.prefix.unlock(req.prefix_node)  # the request still reads it: evictable by mistake
    with pytest.raises(KVOwnershipError, match="lock_ref 0, 1 requests"):
        check(kv, [req])


def test_a_slot_owned_twice_or_free_twice_is_caught():
    """Without any slot lost: two requests own one slot (one's row points at the other's), and a
    free slot listed twice. Found by the check's one-byte-a-slot marks and sorted repeats."""
    kv = make_cache()
    a, b = Req("a", range(10, 20)), Req("b", range(30, 40))
    prefill(kv, a)
    prefill(kv, b)
    kv.extend([a, b], [2, 2])  # two decoded slots each: the requests' own
    slot = int(kv.req_to_token.table[a.row, a.kv_len - 1])
    kv.allocator.free(kv.req_to_token.table[b.row, b.kv_len - 1:b.kv_len].long())  # b gives its last back...
    kv.req_to_token.table[b.row, b.kv_len - 1] = slot  # ...and reads a's instead
    with pytest.raises(KVOwnershipError, match=f"slot {slot} has 2 owners"):
        check(kv, [a, b])
    kv = make_cache()
    extra = kv.allocator.free_slots[:1].clone()
    kv.allocator.free_slots = torch.cat([kv.allocator.free_slots, extra])
    with pytest.raises(KVOwnershipError, match=f"slot {int(extra)} has 2 owners: \\['free list'\\]"):
        check(kv, [])
