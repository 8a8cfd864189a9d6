"""The prefix cache's radix tree and the slot table around it, against hand-built expectations:
which slots a prompt matches, which are freed when, and that nothing a request reads is ever
freed. Mutation checks: dropping `_split` (match ends mid-edge) fails the split test; freeing
`row[:kv_len]` instead of `row[prefix_len:kv_len]` in `KVCache.release` fails the release test;
unlock not walking the ancestors fails the eviction test; reset freeing locked nodes fails the
reset test; evict taking locked leaves too, or `_split` giving the upper node no lock count,
fails the random-operations test."""

from __future__ import annotations

import torch

from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.kvcache.prefix_cache import PrefixCache, _descendants


class Req:
    def __init__(self, prompt):
        self.prompt_ids, self.output_ids = list(prompt), []
        self.row = self.prefix_node = None
        self.kv_len = self.num_computed = self.prefix_len = self.peak_kv = self.cached_tokens = 0


def make_cache(num_slots=64):
    pool = KVPool(num_slots, 2, 1, 4, torch.float32, torch.device("cpu"))
    return KVCache(pool, max_requests=6, max_len=40, prefix_cache=True)


def tree(freed=None):
    return PrefixCache(lambda s: freed.extend(s.tolist()) if freed is not None else None,
                       torch.device("cpu"))


def t(*xs):
    return torch.tensor(xs)


def test_match_splits_an_edge_and_insert_keeps_existing_slots():
    c = tree()
    m, existed = c.insert([1, 2, 3, 4], t(10, 11, 12, 13))
    assert existed == 0 and m.slots.tolist() == [10, 11, 12, 13]
    m = c.match([1, 2, 9])
    assert m.length == 2 and m.slots.tolist() == [10, 11] and m.node.tokens == [1, 2]
    m, existed = c.insert([1, 2, 7, 8], t(20, 21, 22, 23))
    assert existed == 2 and m.slots.tolist() == [10, 11, 22, 23]  # the cached head wins
    assert c.cached_tokens == 6 and c.evictable == 6
    assert c.match([1, 2, 3, 4, 5]).slots.tolist() == [10, 11, 12, 13]


def test_locks_protect_paths_and_eviction_is_lru_leaves_first():
    freed = []
    c = tree(freed)
    a, _ = c.insert([1, 2, 3], t(1, 2, 3))
    b, _ = c.insert([1, 2, 4], t(1, 2, 4))  # shares [1, 2]: slots 1, 2 once
    d, _ = c.insert([5, 6], t(5, 6))
    c.match([5, 6])  # d is now the most recently used
    c.lock(a.node)
    assert c.evictable == 3  # 4, 5, 6 (the path 1, 2, 3 is locked)
    assert c.unlocked_on_path(b.node) == 1
    assert c.evict(1) == 1 and freed == [4]  # LRU unlocked leaf; [1, 2] stays (a holds it)
    assert c.evict(10) == 2 and freed == [4, 5, 6]
    c.unlock(a.node)
    assert c.evictable == 3
    assert c.evict(10) == 3 and sorted(freed) == [1, 2, 3, 4, 5, 6] and c.cached_tokens == 0


def test_reset_frees_unlocked_now_and_locked_at_unlock():
    freed = []
    c = tree(freed)
    a, _ = c.insert([1, 2, 3], t(1, 2, 3))
    c.insert([7], t(7))
    c.lock(a.node)
    c.reset()
    assert freed == [7] and c.match([1, 2, 3]).length == 0  # never matched again
    c.unlock(a.node)
    assert sorted(freed) == [1, 2, 3, 7]
    assert c.cached_tokens == 0 and c.evictable == 0


def test_release_frees_only_own_slots_and_cache_prompt_swaps_duplicates():
    kv = make_cache(num_slots=32)
    r1 = Req([1, 2, 3, 4])
    kv.attach(r1, kv.match([1, 2, 3]))
    kv.extend([r1], [4])  # slots 1..4
    kv.cache_prompt(r1)
    assert r1.prefix_len == 4 and kv.prefix.cached_tokens == 4
    r2 = Req([1, 2, 3, 4])
    kv.attach(r2, kv.match([1, 2, 3]))  # capped at len - 1
    assert r2.kv_len == 3 and r2.cached_tokens == 3
    kv.extend([r2], [1])  # its own copy of token 4: slot 5
    kv.cache_prompt(r2)  # the cached slot 4 replaces it, slot 5 is freed
    table = kv.req_to_token.table
    assert table[r2.row, :4].tolist() == [1, 2, 3, 4] and r2.prefix_len == 4
    kv.extend([r2], [2])  # decode slots, its own
    assert kv.allocator.num_free == 31 - 4 - 2
    kv.release(r1)
    assert kv.allocator.num_free == 31 - 4 - 2  # r2 still reads the prompt: nothing freed
    kv.release(r2)
    assert kv.allocator.num_free == 31 - 4 and kv.num_free == 31
    kv.flush()
    assert kv.allocator.num_free == 31 and kv.prefix.cached_tokens == 0


def test_share_and_copy_on_write_compaction_never_writes_a_shared_slot():
    kv = make_cache(num_slots=32)
    pool = kv.pool
    pool.k.copy_(torch.arange(pool.k.numel(), dtype=torch.float32).view_as(pool.k))
    lead, foll = Req([1, 2, 3, 4, 5, 6]), Req([1, 2, 3, 4, 5, 6])
    kv.attach(lead)
    kv.attach(foll)
    kv.extend([lead], [6])
    kv.cache_prompt(lead)
    kv.share(foll, lead)
    shared_before = pool.k[:, 1:7].clone()
    slots = kv.req_to_token.table[foll.row, :6].long()[None]
    keep = torch.tensor([0, 2, 5]).expand(1, 2, 1, 3)  # [R, L, Hkv, k]
    kv.compact([foll], slots, keep)
    assert torch.equal(pool.k[:, 1:7], shared_before)  # shared slots untouched
    own = kv.req_to_token.table[foll.row, :3].long()
    assert set(own.tolist()).isdisjoint(range(1, 7)) and foll.prefix_len == 0
    assert torch.equal(pool.k[:, own], shared_before[:, [0, 2, 5]])
    kv.release(foll)
    kv.release(lead)
    kv.flush()
    assert kv.allocator.num_free == 31


def test_random_operations_against_a_prefix_dict():
    """300 seeded random sequences of insert / match / lock / unlock / evict / reset on short
    token strings over a 3-letter alphabet (many shared heads), checked against a dict of every
    cached prefix -> its slot: matches are the longest cached prefix with its slots, a locked
    path is never freed, and at the end every slot the tree took is freed exactly once."""
    import random

    for seed in range(300):
        rng = random.Random(seed)
        freed: list[int] = []
        c, ref, locks, taken, next_slot = tree(freed), {}, [], [], 1
        for _ in range(30):
            toks = [rng.randint(0, 2) for _ in range(rng.randint(1, 6))]
            op = rng.random()
            if op < 0.4:
                slots = torch.arange(next_slot, next_slot + len(toks))
                next_slot += len(toks)
                m, existed = c.insert(toks, slots)
                taken += slots[existed:].tolist()
                for i in range(existed, len(toks)):
                    ref[tuple(toks[:i + 1])] = int(slots[i])
                if rng.random() < 0.5:
                    c.lock(m.node)
                    locks.append((m.node, [ref[tuple(toks[:i + 1])] for i in range(len(toks))]))
            elif op < 0.6 and locks:
                c.unlock(locks.pop(rng.randrange(len(locks)))[0])
            elif op < 0.8:
                before = len(freed)
                c.evict(rng.randint(1, 6))
                gone = set(freed[before:])
                ref = {k: v for k, v in ref.items() if v not in gone}
            elif op < 0.85:
                c.reset()
                ref = {}
            n = 0
            while n < len(toks) and tuple(toks[:n + 1]) in ref:
                n += 1
            m = c.match(toks)
            assert m.slots.tolist() == [ref[tuple(toks[:i + 1])] for i in range(n)], seed
            held = {s for _, path in locks for s in path}
            assert not held & set(freed), seed
            nodes = list(_descendants(c.root))
            assert c.evictable == sum(x.slots.numel() for x in nodes if x.lock_ref == 0), seed
            assert c.cached_tokens == sum(x.slots.numel() for x in nodes), seed
        for node, _ in locks:
            c.unlock(node)
        c.reset()
        assert sorted(freed) == sorted(taken), seed
        assert c.cached_tokens == 0 and c.evictable == 0
