"""Continuous batching: admit waiting requests by free KV, decode the running ones, preempt on OOM.

A step is either a prefill of newly admitted requests or one decode token for every running
request (prefill first, as nano-vllm does). Admission is FIFO and keeps a reserve of free slots
for the next few decode steps of everything running; when a decode step still lacks slots, the
most recently admitted requests are preempted: their slots are freed and they go back to the
front of the queue to be recomputed from prompt + generated tokens, keeping what they sampled.

With KV compression, a request's footprint is bounded (trigger.py `bound`: at most
max(held + 1, B + N) slots), so admission reserves each request's whole remaining growth up to
that bound instead of a few steps: admitted requests then never need preemption, and slots freed
by compaction admit the next waiting requests.

With overlap scheduling the engine schedules step N+1 before it has read step N's tokens, so a
running request may already have sampled its last token (max_new_tokens or the context length,
counting the step in flight): it sits out of decode batches until the engine finishes it.
`version` changes whenever the set of running requests does, so the runner can keep per-batch
tensors (rows, sampling parameters) across the steps of an unchanged batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..kvcache.kv_cache import KVCache
from .sequence import Sequence, Status


@dataclass
class Batch:
    is_prefill: bool
    seqs: list[Sequence]
    version: int = -1  # the scheduler's version when built: same version + length = same seqs


@dataclass
class SchedulerConfig:
    max_running_requests: int
    max_prefill_tokens: int
    # Free slots kept per running request at admission, so fresh admissions do not force an
    # immediate preemption on the next decode steps.
    reserve_steps: int = 8
    max_seq_len: int = 1 << 62  # prompt + output tokens at which a request stops decoding


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCache, bound=None):
        """`bound(seq, held) -> slots`: the most a request will hold from now on (compression);
        None = dense, reserve `reserve_steps` decode tokens per request."""
        self.cfg, self.kv, self.bound = cfg, kv, bound
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.paused = False
        self.version = 0
        # Concurrency stats: most requests running at once; decode steps and the requests in them.
        self.max_running = 0
        self.decode_steps = 0
        self.decode_seq_steps = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return not self.paused and bool(self.waiting or self.running)

    def schedule(self) -> Batch | None:
        if self.paused:
            return None
        admitted = self._admit()
        if admitted:
            return Batch(True, admitted, self.version)
        seqs = self._make_room_for_decode()
        if not seqs:
            return None
        self.decode_steps += 1
        self.decode_seq_steps += len(seqs)
        return Batch(False, seqs, self.version)

    def _decodable(self) -> list[Sequence]:
        limit = self.cfg.max_seq_len
        return [s for s in self.running if s.can_decode(limit)]

    def _reserve(self, seqs) -> int:
        if self.bound is not None:
            return sum(max(self.bound(s, s.kv_len) - s.kv_len, 0) for s in seqs)
        r = self.cfg.reserve_steps
        return sum(min(r, s.params.max_new_tokens - len(s.output_ids)) for s in seqs)

    def _future(self, seq: Sequence, need: int) -> int:
        """Slots a waiting request may need beyond its prefill's `need`."""
        if self.bound is not None:
            return max(self.bound(seq, seq.num_tokens) - need, 0)
        return min(self.cfg.reserve_steps, seq.params.max_new_tokens - len(seq.output_ids))

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        if not self.waiting:
            return admitted
        budget = self.cfg.max_prefill_tokens
        reserve = self._reserve(self.running)
        free = self.kv.num_free
        while self.waiting:
            seq = self.waiting[0]
            need = seq.num_tokens - seq.num_computed
            if len(self.running) + len(admitted) >= self.cfg.max_running_requests:
                break
            if not self.kv.has_free_row():
                break
            if admitted and need > budget:
                break
            seq_reserve = self._future(seq, need)
            if need + reserve + seq_reserve > free:
                # Alone and idle, a request that fits the pool must run even without a reserve.
                if self.running or admitted or need > free:
                    break
            self.waiting.popleft()
            self.kv.attach(seq)
            seq.status = Status.RUNNING
            admitted.append(seq)
            budget -= need
            free -= need
            reserve += seq_reserve
        self.running.extend(admitted)
        self.version += bool(admitted)
        self.max_running = max(self.max_running, len(self.running))
        return admitted

    def _make_room_for_decode(self) -> list[Sequence]:
        """Preempt the newest requests until every decodable one gets a slot; returns those."""
        seqs = self._decodable()
        while seqs and self.kv.num_free < len(seqs):
            self.preempt(self.running[-1])
            seqs = self._decodable()
        return seqs

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.version += 1
        self.kv.release(seq)
        if seq.eviction is not None:  # readmitted, the query at its last sampled token samples
            seq.eviction.on_reset(len(seq.prompt_ids) + seq.num_sampled - 1)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a request (finished or aborted) and free its KV."""
        if seq in self.running:
            self.running.remove(seq)
            self.version += 1
            self.kv.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def retract_all(self) -> None:
        for seq in reversed(list(self.running)):
            self.preempt(seq)
