"""Engine side of compression: after a step, compress the requests whose trigger fired.

Requests compressing in the same step with the same held length n (and the same pinned prompt
P and budget B) are scored together: keys are gathered from the pool through their slot-table
rows, queries from the ring, the policy returns kept positions per layer and KV head, and
`KVCache.compact` moves the kept K/V into the requests' first B slots and frees the rest. With
keep_prompt the prompt's slots are left out: only row[P:n] is scored (the prompt is neither a
candidate nor in the importance softmax) and compacted into row[P:P + B]. Work is split into
chunks whose scoring holds at most `chunk_elems` floats (R-KV's n x n similarity matrices on the
torch path; on CUDA its Triton pass holds none, so a chunk takes ~3x more requests at the 0.5B
shape and a compaction of 256 requests makes 8 scoring rounds, not 24). Runs eagerly between decode steps (never
inside a captured CUDA graph).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ..kvcache.host_copy import ints_to_device
from .base import CompressionConfig
from .eviction_record import on_compact_group
from .query_ring import QueryRing
from .trigger import Trigger
from . import make_policy


class Compressor:
    def __init__(self, cfg: CompressionConfig, kv, ring: QueryRing | None, trigger: Trigger,
                 chunk_elems: int = 1 << 28):
        self.cfg, self.kv, self.ring, self.trigger = cfg, kv, ring, trigger
        self.policy = make_policy(cfg.policy_config())
        self.chunk_elems = chunk_elems
        self.num_compressions = 0  # compaction events over all requests
        self.tokens_evicted = 0
        self._fire_at: dict = {}  # request -> the fewest held slots at which it may compress

    def bound(self, seq, held: int) -> int:
        return self.trigger.bound(seq, held)

    def cow_slots(self, seq, shared: int) -> int:
        """Slots a compaction may take from the pool to copy `shared` shared slots at the head of
        the request's row (copy-on-write, KVCache.compact): none while they stay pinned."""
        if shared <= self.trigger.pinned(seq):
            return 0
        return min(shared, self.trigger.floor(seq))

    def after_step(self, seqs: list, is_prefill: bool) -> None:
        groups: dict[tuple[int, int, int], list] = defaultdict(list)
        trigger = self.trigger
        watch_think = trigger.think_end_id is not None
        for s in self._candidates(seqs, is_prefill, watch_think):
            if watch_think:
                trigger.observe(s)
            if s.kv_len > trigger.floor(s) and trigger.should_compress(s, is_prefill):
                groups[s.kv_len, trigger.pinned(s), trigger.budget(s)].append(s)
        for (n, pinned, _), group in groups.items():
            per_req = self._elems_per_request(n - pinned)
            step = max(1, self.chunk_elems // per_req)
            for i in range(0, len(group), step):
                self.compress(group[i:i + step])

    def _candidates(self, seqs: list, is_prefill: bool, watch_think: bool) -> list:
        """The requests the trigger must look at after this step. This runs every step for
        every request: after a decode step, a request below its first possible firing point
        (pinned + B + N held, or pinned + B + 1 with newline splitting) cannot compress, and
        that point, fixed per request, is cached, so the scan is a lookup and a comparison.
        Prefill steps and `</think>` watching (it notes every fed token) see every request."""
        if is_prefill or watch_think:
            return seqs
        fire = self._fire_at
        if len(fire) > 4 * len(seqs) + 1024:  # finished requests' entries
            fire.clear()
        trigger, out = self.trigger, []
        ahead = self.cfg.divide_length if self.cfg.divide_method == "step_length" else 1
        for s in seqs:
            at = fire.get(s)
            if at is None:
                at = fire[s] = trigger.floor(s) + ahead
            if s.kv_len >= at:
                out.append(s)
        return out

    def _elems_per_request(self, n: int) -> int:
        """Floats one request's scoring of n slots holds at once: per layer and KV head its keys
        (gathered, and an fp32 copy), the policy's scratch and a few score rows; per layer, with
        queries, the window's importance logits and their softmax (query heads x window x m)."""
        pool = self.kv.pool
        L, _, hkv, d = pool.shape
        m = n - self.cfg.window
        per_head = self.policy.scratch_elems(m, pool.device, d) + 2 * n * d + m * 8
        ring = self.ring if self.policy.needs_queries else None
        queries = 0 if ring is None else ring.buf.shape[3] * self.cfg.window
        return L * (hkv * per_head + 2 * queries * m)

    @torch.inference_mode()
    def compress(self, seqs: list) -> torch.Tensor:
        """Compress requests that all hold the same n slots, pin the same P and keep the same
        B: the evictable part row[P:n] goes down to B. Returns the kept positions of row[:n]
        [R, L, Hkv, P + B] (the pinned prompt first)."""
        first, kv = seqs[0], self.kv
        n, pinned, keep = first.kv_len, self.trigger.pinned(first), self.trigger.budget(first)
        rows = ints_to_device([s.row for s in seqs], kv.pool.device)
        slots = kv.req_to_token.table[rows, pinned:n].long()  # [R, n - P]: the evictable slots
        keys = kv.pool.keys(slots).permute(1, 0, 3, 2, 4)  # [R, L, Hkv, n - P, D], dequantized
        queries = self.ring.gather(rows) if self.policy.needs_queries else None
        idx = self.policy.select(keys, queries, keep)
        del keys, queries
        kv.compact(seqs, slots, idx, offset=pinned)
        idx = _after_pinned(idx, pinned)
        evicted = n - pinned - keep
        for s in seqs:
            # kv_len only grows between compactions, so its peak is seen here or at release.
            s.peak_kv = max(s.peak_kv, n)
            s.num_compressions += 1
            s.tokens_evicted += evicted
        _record_evictions(seqs, idx, n)
        self.num_compressions += len(seqs)
        self.tokens_evicted += len(seqs) * evicted
        return idx


def _record_evictions(seqs: list, idx: torch.Tensor, n: int) -> None:
    """The compaction in the eviction records of the requests that keep one, batched; each is
    gone for the queries from the step after the one that fed num_computed - 1."""
    rec = [i for i, s in enumerate(seqs) if s.eviction is not None]
    if rec:
        rows = idx if len(rec) == len(seqs) else idx[rec]  # (all of them: no copy)
        on_compact_group([seqs[i].eviction for i in rec], rows, n,
                         [seqs[i].num_computed for i in rec])


def _after_pinned(idx: torch.Tensor, pinned: int) -> torch.Tensor:
    """Kept positions of the evictable part [..., B] -> of the whole row: 0..P-1, then P + idx."""
    if not pinned:
        return idx
    head = torch.arange(pinned, device=idx.device).expand(*idx.shape[:-1], pinned)
    return torch.cat([head, idx + pinned], dim=-1)
