"""Where a token's KV lives: a pool of token slots, a free-list allocator, and per-request slot tables.

- `KVPool`: K and V buffers of shape [num_layers, num_slots, num_kv_heads, head_dim]. Keys are
  stored after RoPE, so a slot's content never depends on where it sits in the request's table.
  An FP8 pool (kv_quant.py) stores quantized bytes; `write`/`read`/`keys` (de)quantize, and
  compaction moves the raw bytes (exact).
- `SlotAllocator`: the free slot ids as a device tensor; alloc takes a prefix, free appends.
- `ReqToToken`: one row per running request, row[i] = slot of the request's i-th held KV entry.
  A request's attention reads row[:kv_len] and nothing else, which is what lets compaction keep a
  subset in the first slots and free the tail (same slot table for every layer and KV head;
  `KVCache.compact` may put different tokens of different layers/heads in one slot).

Slot 0 and table row 0 are reserved as padding targets (padded decode rows write there), so
they are never handed out.

With the prefix cache (prefix_cache.py) a request's row may start with `seq.prefix_len` slots
owned by the cache, which it reads under a lock and never frees; `release` frees only the rest.
Every slot has one owner (the free list, the cache, or one request's row[prefix_len:kv_len]):
ownership.py states the invariant and checks it in debug mode (SGLANG_KVC_CHECK_KV=1).
"""

from __future__ import annotations

import numpy as np
import torch

from .host_copy import ints_to_device
from .prefix_cache import Match, PrefixCache
from .kv_quant import dequantize, is_fp8, quantize
from .stable_memory import StableMemory


class KVPool:
    """`dtype` is what a slot holds: the model dtype, another float dtype, or FP8 (kv_quant.py:
    stored as uint8 bytes, with per-layer `k_scale` / `v_scale`; `compute_dtype` is what reads
    dequantize to). Scales live on the device (kernels and captured graphs read them there) and
    survive release/allocate. `stable_address` (CUDA): the pool's memory comes from a reserved
    address range (stable_memory.py), so a release/allocate cycle gives the memory back and
    returns it at the same address, and graphs captured on the pool stay valid."""

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, compute_dtype: torch.dtype | None = None,
                 k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 stable_address: bool = False):
        self.num_slots, self.num_layers = num_slots, num_layers
        self.shape = (num_layers, num_slots, num_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.quantized = is_fp8(dtype)
        self.store_dtype = torch.uint8 if self.quantized else dtype
        self.compute_dtype = compute_dtype or (torch.bfloat16 if self.quantized else dtype)
        ones = torch.ones(num_layers, dtype=torch.float32)
        self.k_scale = (ones if k_scale is None else k_scale).to(device=device, dtype=torch.float32)
        self.v_scale = (ones if v_scale is None else v_scale).to(device=device, dtype=torch.float32)
        self.k = self.v = None
        self.stable = StableMemory(2 * self._v_offset(), device) if stable_address else None
        self.allocate()

    @property
    def numel(self) -> int:
        """Elements of K (= of V)."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def bytes(self) -> int:
        return 2 * self.numel * torch.empty((), dtype=self.store_dtype).element_size()

    def _v_offset(self) -> int:
        """Where V starts in a stable range: after K, 512-byte aligned."""
        return (self.bytes // 2 + 511) // 512 * 512

    def allocate(self) -> None:
        if self.stable is None:
            self.k = torch.zeros(self.shape, dtype=self.store_dtype, device=self.device)
            self.v = torch.zeros(self.shape, dtype=self.store_dtype, device=self.device)
            return
        self.stable.map()  # zeroed
        self.k = self.stable.tensor(self.store_dtype, 0, self.numel).view(self.shape)
        self.v = self.stable.tensor(self.store_dtype, self._v_offset(), self.numel).view(self.shape)

    def release(self) -> None:
        self.k = self.v = None  # no view of the range may outlive its mapping
        if self.stable is not None:
            self.stable.unmap()

    @property
    def allocated(self) -> bool:
        return self.k is not None

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, Hkv, D] into `slots` [T] of `layer` (quantized when the pool is FP8)."""
        if self.quantized:
            k = quantize(k, self.k_scale[layer], self.dtype).view(torch.uint8)
            v = quantize(v, self.v_scale[layer], self.dtype).view(torch.uint8)
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` (any shape [...]) in `layer`: [..., Hkv, D], dequantized."""
        k, v = self.k[layer][slots], self.v[layer][slots]
        if not self.quantized:
            return k, v
        return (dequantize(k.view(self.dtype), self.k_scale[layer], self.compute_dtype),
                dequantize(v.view(self.dtype), self.v_scale[layer], self.compute_dtype))

    def keys(self, slots: torch.Tensor) -> torch.Tensor:
        """Every layer's keys of `slots` [R, n] as [L, R, n, Hkv, D], dequantized (scoring)."""
        if not self.quantized:
            return self.k[:, slots]
        # Layer by layer into one compute-dtype tensor: dequantizing all layers at once made an
        # fp32 copy of every scored key (2 GB for 256 requests x 640 slots of the 0.5B model),
        # twice the bf16 keys, at every compaction.
        out = torch.empty((self.k.shape[0], *slots.shape, *self.k.shape[2:]), dtype=self.compute_dtype,
                          device=self.k.device)
        for layer in range(self.k.shape[0]):
            out[layer] = dequantize(self.k[layer, slots].view(self.dtype), self.k_scale[layer],
                                    self.compute_dtype)
        return out

    def layer_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer`'s K and V buffers [num_slots, Hkv, D] as kernels read them (FP8 views)."""
        if not self.quantized:
            return self.k[layer], self.v[layer]
        return self.k[layer].view(self.dtype), self.v[layer].view(self.dtype)

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`layer`'s (k_scale, v_scale) as one-element device views, None for an unquantized
        pool (kernels then compile without the FP8 code)."""
        if not self.quantized:
            return None
        return self.k_scale[layer:layer + 1], self.v_scale[layer:layer + 1]


def segments(counts: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a flat batch of requests with `counts` tokens each (int64 numpy arrays): each
    token's request index [T], each request's first flat index [B], each token's index within
    its request [T]. One place for the arithmetic that replaces per-request Python loops. In
    numpy, as the callers' arithmetic on them: torch's CPU ops on such small arrays took ~1-2 ms
    a call on an H200 machine's host (repeat_interleave ~2.3 ms; index ~1.7 ms: its profiles
    of multi-turn prefill steps, 2026-11-29), a dozen calls a prefill step."""
    n = np.asarray(counts, dtype=np.int64)
    start = np.cumsum(n) - n
    seg = np.repeat(np.arange(len(n), dtype=np.int64), n)
    offset = np.arange(len(seg), dtype=np.int64) - start[seg]
    return seg, start, offset


class SlotAllocator:
    def __init__(self, num_slots: int, device: torch.device):
        self.num_slots, self.device = num_slots, device
        self.reclaimable = lambda: 0  # slots the prefix cache could evict (KVCache sets it)
        self.reset()

    def reset(self) -> None:
        self._free = torch.arange(1, self.num_slots, dtype=torch.int64, device=self.device)
        self._freed: list[torch.Tensor] = []  # freed since the list was last read (see free)
        self._num_free = self.num_slots - 1
        # Most slots ever held at once by requests (allocations happen before compaction); slots
        # the prefix cache could evict (`reclaimable`) are room, not use.
        self.peak_used = 0

    @property
    def capacity(self) -> int:
        return self.num_slots - 1

    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor:
        if n > self._num_free:
            raise RuntimeError(f"KV pool exhausted: want {n} slots, {self._num_free} free")
        free = self.free_slots
        out, self._free = free[:n], free[n:]
        self._num_free -= n
        self.peak_used = max(self.peak_used, self.capacity - self._num_free - self.reclaimable())
        return out

    @property
    def free_slots(self) -> torch.Tensor:
        """The free slots, in the order alloc hands them out."""
        if self._freed:
            self._free = torch.cat([self._free, *self._freed])
            self._freed = []
        return self._free

    @free_slots.setter
    def free_slots(self, slots: torch.Tensor) -> None:
        self._free, self._freed = slots, []

    def free(self, slots: torch.Tensor) -> None:
        """Freed slots queue up and join the free list when it is next read: one concatenation
        per step instead of one per finished request (each copied the whole free list)."""
        if slots.numel():
            self._freed.append(slots.to(torch.int64, copy=True))  # the caller may reuse its tensor
            self._num_free += slots.numel()


class ReqToToken:
    def __init__(self, max_requests: int, max_len: int, device: torch.device):
        # +1: row 0 is the padding row (all zeros -> slot 0).
        self.table = torch.zeros(max_requests + 1, max_len, dtype=torch.int32, device=device)
        self.free_rows = list(range(max_requests, 0, -1))

    @property
    def max_len(self) -> int:
        return self.table.shape[1]

    def alloc_row(self) -> int:
        return self.free_rows.pop()

    def free_row(self, row: int) -> None:
        self.free_rows.append(row)


class KVCache:
    """The three pieces above plus the per-request operations the scheduler and runner need, and
    the prefix cache (`prefix`, None when --disable-radix-cache)."""

    def __init__(self, pool: KVPool, max_requests: int, max_len: int, prefix_cache: bool = False):
        self.pool = pool
        self.allocator = SlotAllocator(pool.num_slots, pool.device)
        self.req_to_token = ReqToToken(max_requests, max_len, pool.device)
        self.prefix = PrefixCache(self.allocator.free, pool.device) if prefix_cache else None
        if self.prefix is not None:
            self.allocator.reclaimable = lambda: self.prefix.evictable

    @property
    def num_free(self) -> int:
        """Slots a request can get: the free list plus cached slots no request reads (evicted
        on demand). `capacity - num_free` is what requests hold, shared slots once."""
        return self.allocator.num_free + (self.prefix.evictable if self.prefix is not None else 0)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def has_free_row(self) -> bool:
        return bool(self.req_to_token.free_rows)

    def _alloc(self, n: int) -> torch.Tensor:
        short = n - self.allocator.num_free
        if short > 0 and self.prefix is not None:
            self.prefix.evict(short)
        return self.allocator.alloc(n)

    # ---------------------------------------------------------------- prefix sharing

    def match(self, tokens: list[int]) -> Match | None:
        """The cached prefix of `tokens` (None without a cache or tokens)."""
        if self.prefix is None or not tokens:
            return None
        return self.prefix.match(tokens)

    def attach(self, seq, match: Match | None = None) -> None:
        """Give `seq` a table row; with a `match`, its head reads the cached prefix (locked)."""
        seq.row = self.req_to_token.alloc_row()
        seq.kv_len, seq.prefix_len, seq.prefix_node = 0, 0, None
        if match is not None and match.length:
            m = match.length
            self.req_to_token.table[seq.row, :m] = match.slots.to(torch.int32)
            self._hold(seq, match.node, m)
            seq.kv_len = seq.num_computed = m
            self._count_hit(seq, m)

    def _hold(self, seq, node, length: int) -> None:
        self.prefix.lock(node)
        if seq.prefix_node is not None:
            self.prefix.unlock(seq.prefix_node)
        seq.prefix_node, seq.prefix_len = node, length

    def _count_hit(self, seq, n: int) -> None:
        """`seq` skipped computing n prompt tokens (meta_info.cached_tokens, hit stats)."""
        seq.cached_tokens = max(seq.cached_tokens, n)
        self.prefix.hit_tokens += n

    def cache_prompt(self, seq) -> None:
        """After `seq`'s prefill: its prompt's slots join the cache. Where the cache already held
        part of the prompt (cached by a batch-mate, or past its capped match), the cached slots
        replace the request's own copies, which are freed: its whole prompt is then shared."""
        P = len(seq.prompt_ids)
        if seq.prefix_len >= P:
            return
        row = self.req_to_token.table[seq.row, :P].long()
        m, existed = self.prefix.insert(seq.prompt_ids, row)
        if existed > seq.prefix_len:
            self.allocator.free(row[seq.prefix_len:existed])
            self.req_to_token.table[seq.row, seq.prefix_len:existed] = \
                m.slots[seq.prefix_len:existed].to(torch.int32)
        self._hold(seq, m.node, P)

    def share(self, follower, leader) -> None:
        """`follower` has `leader`'s prompt (cached by `cache_prompt`): it reads the same slots."""
        P = len(leader.prompt_ids)
        table = self.req_to_token.table
        table[follower.row, :P] = table[leader.row, :P]
        self._hold(follower, leader.prefix_node, P)
        follower.kv_len = follower.num_computed = P
        self._count_hit(follower, P)

    def flush(self) -> None:
        """Forget every cached prefix (requests still reading one keep it until they finish)."""
        if self.prefix is not None:
            self.prefix.reset()

    # ---------------------------------------------------------------- per-request slots

    def extend(self, seqs: list, counts: list[int]) -> torch.Tensor:
        """Allocate `counts[i]` new slots at the end of seqs[i]'s table; returns them flat."""
        slots = self._alloc(sum(counts))
        seg, _, offset = segments(counts)
        rows = np.asarray([s.row for s in seqs], dtype=np.int64)[seg]
        cols = np.asarray([s.kv_len for s in seqs], dtype=np.int64)[seg] + offset
        where = ints_to_device(np.stack([rows, cols]), slots.device)  # no device sync
        # one scatter for the whole batch (a slice assignment per request cost ~3 launches each)
        self.req_to_token.table[where[0], where[1]] = slots.to(torch.int32)
        for s, c in zip(seqs, counts):
            s.kv_len += c
        return slots

    def extend_one(self, seqs: list, rows: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
        """Decode: one new slot per request, written with a single scatter. `rows`/`kv_lens` are
        the requests' rows and current lengths already on the device."""
        slots = self.alloc_one(seqs)
        self.req_to_token.table[rows, kv_lens] = slots.to(torch.int32)
        return slots

    def alloc_one(self, seqs: list) -> torch.Tensor:
        """One new slot per request, counted in its kv_len; the caller writes the table (a
        captured decode step does it on the device)."""
        slots = self._alloc(len(seqs))
        for s in seqs:
            s.kv_len += 1
        return slots

    def compact(self, seqs: list, slots: torch.Tensor, keep_idx: torch.Tensor,
                offset: int = 0) -> None:
        """Keep, per layer and KV head, the entries at positions `keep_idx` [R, L, Hkv, k] of
        each request's row[:n] (`slots` [R, n], the rows' current slots), moved into the
        request's first k slots; free the other n - k slots.

        Layers and heads may keep different tokens: slot row[j] then holds, for each (layer,
        head), that head's j-th kept entry. Keys carry their RoPE, so moving them is exact.
        `slots` may be a row's tail row[offset:n] (a pinned head is left as it is): the request
        then holds offset + k slots. A shared prefix reaching into row[offset:] is copied on
        write (`_targets`).
        """
        k = keep_idx.shape[-1]
        src = slots.gather(1, keep_idx.flatten(1)).view_as(keep_idx)  # [R, L, Hkv, k]
        dst, freed = self._targets(seqs, slots, k, offset)
        src, dst = self._entry_index(src), self._entry_index(dst[:, None, None, :].expand_as(src))
        for buf in (self.pool.k, self.pool.v):
            flat = buf.view(-1, buf.shape[-1])  # one row per (layer, slot, head) entry
            # index_select materialises every kept entry before index_copy_ writes, so
            # overlapping source and destination slots of the same request are safe.
            flat.index_copy_(0, dst, flat.index_select(0, src))
        self.allocator.free(freed)
        for s in seqs:
            s.kv_len = offset + k

    def _targets(self, seqs: list, slots: torch.Tensor, k: int, offset: int):
        """The [R, k] slots the kept entries move to, and the slots freed. A request whose shared
        prefix reaches into the compacted part never writes a shared slot: its kept entries go
        to its own slots (topped up from the pool) and it keeps its lock on the head before `offset`
        only (copy-on-write)."""
        if all(s.prefix_len <= offset for s in seqs):
            return slots[:, :k], slots[:, k:].flatten()
        dst, freed = [], []
        for i, s in enumerate(seqs):
            own = slots[i, max(s.prefix_len - offset, 0):]
            if s.prefix_len > offset:
                if own.numel() < k:
                    own = torch.cat([own, self._alloc(k - own.numel())])
                self.req_to_token.table[s.row, offset:offset + k] = own[:k].to(torch.int32)
                self._keep_head(s, offset)
            dst.append(own[:k])
            freed.append(own[k:])
        return torch.stack(dst), torch.cat(freed)

    def _keep_head(self, seq, n: int) -> None:
        """`seq` now reads only the first n slots of its cached prefix (row[n:] became its own
        copies): it keeps a lock on that head alone. Row[:n] still points at cache-owned slots
        (a pinned prompt), so prefix_len must stay n: at 0, `release` would free slots the cache
        owns and the cache would free them again (a double free)."""
        if n == 0:
            self.prefix.unlock(seq.prefix_node)
            seq.prefix_node, seq.prefix_len = None, 0
        else:
            self._hold(seq, self.prefix.ancestor_at(seq.prefix_node, n), n)

    def _entry_index(self, slots: torch.Tensor) -> torch.Tensor:
        """Flat row of pool entry (layer l, slot, head h) for `slots` [R, L, Hkv, k]: one
        index_select/index_copy_ pair moves them (cheaper than multi-tensor advanced indexing)."""
        L, S, hkv, _ = self.pool.shape
        dev = slots.device
        layer = torch.arange(L, device=dev)[None, :, None, None] * (S * hkv)
        head = torch.arange(hkv, device=dev)[None, None, :, None]
        return (layer + slots.long() * hkv + head).flatten()

    def release(self, seq) -> None:
        """Return a request's own slots and its table row, and its lock on a cached prefix."""
        if seq.row is None:
            return
        seq.peak_kv = max(seq.peak_kv, seq.kv_len)  # a compression stat (meta_info)
        if seq.kv_len > seq.prefix_len:
            row = self.req_to_token.table[seq.row, seq.prefix_len:seq.kv_len]
            self.allocator.free(row.to(torch.int64))
        if seq.prefix_node is not None:
            self.prefix.unlock(seq.prefix_node)
        self.req_to_token.free_row(seq.row)
        seq.row, seq.kv_len, seq.prefix_len, seq.prefix_node = None, 0, 0, None

    def reset(self) -> None:
        """Everything free (a re-allocated pool): no request runs, nothing is cached."""
        self.allocator.reset()
        self.req_to_token.free_rows = list(range(self.req_to_token.table.shape[0] - 1, 0, -1))
        if self.prefix is not None:
            self.prefix = PrefixCache(self.allocator.free, self.pool.device)
