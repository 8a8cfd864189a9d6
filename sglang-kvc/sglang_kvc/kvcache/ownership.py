"""Every KV slot has one owner, always: the ownership invariant, and its debug-mode check.

The owners of pool slots 1..capacity (slot 0 is the padding target, owned by nobody):

- the free list (`SlotAllocator`);
- the prefix cache: every slot of a node in its tree, and of a node `reset` dropped that a
  request still locks (*detached*, freed at its last unlock);
- a request holding a slot-table row: running, waiting with KV its session's previous request
  left (adopted), or finished and parked by its session. It owns row[prefix_len:kv_len].

A request's row[:prefix_len] is not owned: it is exactly the slot path of the cache node it
locks (`prefix_node`), which it reads and never frees. The invariant, after every engine step
and command:

1. every slot 1..capacity has exactly one owner: no slot both free and referenced, no slot
   owned twice (two requests, or a request and the cache), none lost;
2. each row's head row[:prefix_len] equals its `prefix_node` path, and prefix_len is that
   path's length (prefix_node None iff prefix_len 0);
3. each node's lock count is the requests whose path goes through it (+1 on the root);
   `evictable` counts the attached tree's unlocked slots, `cached_tokens` all of its slots;
4. hence `used` (capacity - num_free, what get_server_info reports) = the requests' own slots
   (parked ones included) + the locked cache slots (attached or detached); never negative;
5. table rows: each holder has its own, none of them on the free-row list.

`check` walks all of it on the pool's device, in one byte a slot beyond the owners' own slots
(a host copy of the free list and a CPU bincount took seconds a step for a tiny model's
whole-GPU pool of ~10^8-10^9 slots, which made the GPU tests crawl; a device bincount of int64
counts then ran out of memory beside that pool): a debug mode, off unless SGLANG_KVC_CHECK_KV=1
(the test suite turns it on); off, the engine never calls it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .prefix_cache import Node

ENV = "SGLANG_KVC_CHECK_KV"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


class KVOwnershipError(AssertionError):
    """The KV ownership invariant broke (a slot freed twice, leaked, or owned twice)."""


@dataclass
class Owners:
    """Who owns which slots: names[i] owns slots[i] (int64 tensors on the pool's device)."""
    names: list[str]
    slots: list[torch.Tensor]

    def add(self, name: str, slots: torch.Tensor) -> None:
        self.names.append(name)
        self.slots.append(slots.detach().to(torch.int64).flatten())


def _path(node: Node) -> list[Node]:
    """root..node (the root first)."""
    out = []
    while node is not None:
        out.append(node)
        node = node.parent
    return out[::-1]


def _path_slots(node: Node) -> torch.Tensor:
    parts = [n.slots.to(torch.int64) for n in _path(node)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=node.slots.device)


def check(kv, holders: list) -> None:
    """Raise KVOwnershipError when `kv` (a KVCache) with these row-holding requests breaks the
    invariant above. `holders`: every request with a row (running, waiting, parked)."""
    table = kv.req_to_token.table
    owners = Owners([], [])
    owners.add("free list", kv.allocator.free_slots)
    problems = _check_rows(kv, table, holders, owners)
    locked_cache = _cache_owners(kv, holders, owners, problems)
    problems += _check_single_owner(kv, owners)
    own = sum(int(s.kv_len - s.prefix_len) for s in holders)
    used = kv.capacity - kv.num_free
    if used < 0 or used != own + locked_cache:
        problems.append(f"used={used} but requests own {own} slots and the cache holds "
                        f"{locked_cache} locked ones")
    if kv.allocator.num_free != owners.slots[0].numel():
        problems.append(f"allocator counts {kv.allocator.num_free} free slots, its list holds "
                        f"{owners.slots[0].numel()}")
    if problems:
        raise KVOwnershipError("KV ownership invariant broken:\n  " + "\n  ".join(problems[:20]))


def _check_rows(kv, table: torch.Tensor, holders: list, owners: Owners) -> list[str]:
    problems = []
    rows = [s.row for s in holders]
    if len(set(rows)) != len(rows):
        problems.append(f"two requests share a table row: rows {sorted(rows)}")
    if set(rows) & set(kv.req_to_token.free_rows):
        problems.append(f"rows {sorted(set(rows) & set(kv.req_to_token.free_rows))} are held "
                        f"and free")
    for s in holders:
        if not 0 <= s.prefix_len <= s.kv_len:
            problems.append(f"request {s.rid}: prefix_len {s.prefix_len}, kv_len {s.kv_len}")
            continue
        owners.add(f"request {s.rid}", table[s.row, s.prefix_len:s.kv_len])
        problems += _check_head(s, table)
    return problems


def _check_head(s, table: torch.Tensor) -> list[str]:
    """row[:prefix_len] is the locked node's path."""
    if s.prefix_node is None:
        return [] if s.prefix_len == 0 else [
            f"request {s.rid}: prefix_len {s.prefix_len} without a cache node"]
    path = _path_slots(s.prefix_node)
    if path.numel() != s.prefix_len:
        return [f"request {s.rid}: prefix_len {s.prefix_len}, its cache path holds "
                f"{path.numel()} slots"]
    if not torch.equal(table[s.row, :s.prefix_len].long(), path.to(table.device)):
        return [f"request {s.rid}: row[:{s.prefix_len}] is not its cache path's slots"]
    return []


def _cache_owners(kv, holders: list, owners: Owners, problems: list[str]) -> int:
    """Add the cache's slots to `owners`, check lock counts and counters; returns the locked
    cache slots (what `used` counts of the cache)."""
    if kv.prefix is None:
        if any(s.prefix_node is not None for s in holders):
            problems.append("a request holds a cache node but there is no prefix cache")
        return 0
    cache, readers, read = kv.prefix, {}, {}
    for s in holders:
        for n in (_path(s.prefix_node) if s.prefix_node is not None else []):
            read[id(n)] = n
            readers[id(n)] = readers.get(id(n), 0) + 1
    attached = list(cache.nodes())
    detached = [n for n in read.values() if n.detached]
    locked = 0
    for n in attached + detached:
        owners.add("prefix cache", n.slots)
        want = readers.get(id(n), 0)
        if n.lock_ref != want:
            problems.append(f"cache node of {len(n.tokens)} tokens: lock_ref {n.lock_ref}, "
                            f"{want} requests read it")
        locked += n.slots.numel() if n.lock_ref > 0 else 0
    slots = sum(n.slots.numel() for n in attached)
    unlocked = sum(n.slots.numel() for n in attached if n.lock_ref == 0)
    if cache.cached_tokens != slots or cache.evictable != unlocked:
        problems.append(f"cache counts cached_tokens={cache.cached_tokens} "
                        f"evictable={cache.evictable}, its tree holds {slots} ({unlocked} "
                        f"unlocked)")
    return locked


def _check_single_owner(kv, owners: Owners) -> list[str]:
    """Each slot 1..capacity owned exactly once (free list, cache, or one request). In one byte a
    slot beside the owned (not free) slots themselves: a tiny model's whole-GPU pool has ~10^9
    slots, and an int64 count per slot (a bincount over all owners' slots, 16 bytes a slot with
    their concatenation) did not fit beside it on an H200 (2026-11-29: the check ran out of
    memory and the engine thread died). Owners.slots[0] is the free list (`check`)."""
    n = kv.pool.num_slots
    free = owners.slots[0]
    held = [s.to(free.device) for s in owners.slots[1:]]
    flat = torch.cat(held) if held else free[:0]
    if any(s.numel() and (s.min() < 0 or s.max() >= n) for s in (free, flat)):
        return [f"a slot id outside 0..{n - 1}"]
    mark = torch.zeros(n, dtype=torch.uint8, device=free.device)
    mark[free] = 1
    bad = [flat[mark[flat] > 0]]  # owned and free
    if int(mark.sum(dtype=torch.int64)) != free.numel():
        bad.append(_repeated(free))  # in the free list twice
    bad.append(_repeated(flat))  # owned twice (two owners, or one owner twice)
    mark[flat] = 1
    bad.append(torch.nonzero(mark == 0).flatten()[1:6])  # lost (slot 0 is nobody's)
    problems = ["slot 0 (padding) is owned"] if mark[0] else []
    bad = torch.unique(torch.cat(bad))
    for slot in bad[bad > 0][:5].tolist():
        hits = [(name, int((s == slot).sum())) for name, s in zip(owners.names, owners.slots)]
        who = [name for name, k in hits if k]
        problems.append(f"slot {slot} has {sum(k for _, k in hits)} owners: {who or 'none (leaked)'}")
    if bad.numel() > 5:
        problems.append(f"... {bad.numel()} slots or more in all")
    return problems


def _repeated(slots: torch.Tensor) -> torch.Tensor:
    """The ids that occur more than once in `slots` (sorted: memory of its own size)."""
    ordered = torch.sort(slots).values
    return ordered[1:][ordered[1:] == ordered[:-1]]
