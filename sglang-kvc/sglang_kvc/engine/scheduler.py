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

Prefix sharing (kvcache/prefix_cache.py): at admission a request takes the longest cached prefix
of its prompt (its last `match_tail` tokens are always computed: the last gives the logits, and a
compressing request's query ring wants its last w queries), and a fresh request whose prompt
equals one admitted in the same batch (the n samples of a request) becomes that one's follower:
it is not computed, it shares the leader's slots and logits. Shared slots count once: a request
needs only the slots it computes, and cached slots nobody reads are free room (evicted, least
recently used first, before anything is preempted).

Sessions (sessions.py): a finished session request is parked with its KV until the request
continuing it adopts that KV (it waits holding its row and slots, and computes only its new
tokens). Parked KV is room held like a cache's: a waiting request that does not fit, or a decode
step short of slots, drops the least recently parked first, before any running request is
preempted.
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
    # Decode steps a small prefill may wait for more arrivals while others decode (0: prefill
    # at once). A prefill step is eager (~1,000 kernel launches for a 30-layer model: ~65 ms of
    # host on an H200's host against ~2.8 ms a graphed decode step), so multi-turn rollouts,
    # whose turns arrive a few rows at a time, paid one per arrival (docs/engine.md).
    prefill_delay_steps: int = 0
    match_tail: int = 1  # prompt tokens always computed by a compressing request (its query ring)


def _group_key(seq: Sequence) -> tuple:
    """Requests that may share one prefill: the same prompt, and the same query-ring needs (a
    compressing leader computes its last w tokens, which its followers' rings copy)."""
    return seq.compress, tuple(seq.prompt_ids)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCache, bound=None, cow=None):
        """`bound(seq, held) -> slots`: the most a request will hold from now on (compression);
        None = dense, reserve `reserve_steps` decode tokens per request. `cow(seq, shared)`: the
        slots a compaction may allocate to copy `shared` shared slots (compression)."""
        self.cfg, self.kv, self.bound, self.cow = cfg, kv, bound, cow
        self.reclaim = lambda: False  # frees a parked session's KV (sessions.py); True if any
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.paused = False
        self.version = 0
        self._limits: list[int] = []  # each running request's draw limit (_decodable)
        self._limits_for = -1  # the version they were computed at
        # Concurrency stats: most requests running at once; decode steps and the requests in them.
        self.max_running = 0
        self.decode_steps = 0
        self.decode_seq_steps = 0
        self._wait_start = 0  # decode_steps when the waiting queue last became non-empty
        self.delayed_steps = 0  # decode steps taken while a prefill was held back

    def add(self, seq: Sequence) -> None:
        self._note_arrival()
        self.waiting.append(seq)

    def _note_arrival(self) -> None:
        if not self.waiting:
            self._wait_start = self.decode_steps

    def has_work(self) -> bool:
        return not self.paused and bool(self.waiting or self.running)

    def schedule(self) -> Batch | None:
        if self.paused:
            return None
        admitted = self._admit() if self._prefill_due() else []
        if admitted:
            return Batch(True, admitted, self.version)
        seqs = self._make_room_for_decode()
        if not seqs:  # nothing to decode: a held-back prefill goes now
            admitted = self._admit()
            return Batch(True, admitted, self.version) if admitted else None
        if self.waiting:
            self.delayed_steps += 1
        self.decode_steps += 1
        self.decode_seq_steps += len(seqs)
        return Batch(False, seqs, self.version)

    def _prefill_due(self) -> bool:
        """Whether the waiting requests prefill now: always without a delay or with nothing
        running; else once the oldest has waited `prefill_delay_steps` decode steps, or once
        half a prefill batch of tokens waits (a large arrival, e.g. a new rollout, goes at once)."""
        delay = self.cfg.prefill_delay_steps
        if delay <= 0 or not self.running or not self.waiting:
            return True
        if self.decode_steps - self._wait_start >= delay:
            return True
        pending = sum(s.num_tokens - s.num_computed for s in self.waiting)
        return pending >= self.cfg.max_prefill_tokens // 2

    def _decodable(self) -> list[Sequence]:
        """The running requests that may sample another token (Sequence.can_decode), through
        each one's draw limit, computed once per running set: this runs every step over every
        request."""
        if self._limits_for != self.version:
            cap = self.cfg.max_seq_len
            self._limits = [min(s.params.max_new_tokens, cap - len(s.prompt_ids)) for s in self.running]
            self._limits_for = self.version
        return [s for s, limit in zip(self.running, self._limits) if s.num_sampled < limit]

    def _reserve(self, seqs) -> int:
        if self.bound is not None:
            return sum(max(self.bound(s, s.kv_len) - s.kv_len, 0) + self.cow(s, s.prefix_len)
                       for s in seqs)
        r = self.cfg.reserve_steps
        return sum(min(r, s.params.max_new_tokens - len(s.output_ids)) for s in seqs)

    def _future(self, seq: Sequence, shared: int) -> int:
        """Slots a waiting request may need beyond its prefill (which computes all but `shared`
        of its tokens)."""
        if self.bound is not None:
            n = seq.kv_len + seq.num_tokens - seq.num_computed  # held after its prefill
            return max(self.bound(seq, n) - n, 0) + self.cow(seq, shared)
        return min(self.cfg.reserve_steps, seq.params.max_new_tokens - len(seq.output_ids))

    def _match_cap(self, seq: Sequence) -> int:
        """Most prompt tokens `seq` may take from the cache."""
        tail = self.cfg.match_tail if seq.compress else 1
        cap = min(len(seq.prompt_ids), seq.num_tokens - tail)
        if seq.return_logprob and seq.logprob_start_len >= 0 and seq.input_logprobs is None:
            first = max(min(seq.logprob_start_len, len(seq.prompt_ids) - 1), 1)
            cap = min(cap, first - 1)  # input log-probs need the hidden states from there on
        return max(cap, 0)

    def _plan(self, seq: Sequence, leaders: dict):
        """(leader or None, cache match or None, tokens shared) for a waiting request."""
        if self.kv.prefix is None or seq.row is not None:  # a row: KV adopted (sessions.py)
            return None, None, 0
        fresh = seq.num_computed == 0 and not seq.output_ids
        wants_input_lp = seq.return_logprob and seq.logprob_start_len >= 0
        leader = leaders.get(_group_key(seq)) if fresh and not wants_input_lp else None
        if leader is not None:
            return leader, None, len(seq.prompt_ids)
        match = self.kv.match(seq.prompt_ids[:self._match_cap(seq)])
        return None, match, match.length if match is not None else 0

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        if not self.waiting:
            return admitted
        budget = self.cfg.max_prefill_tokens
        reserve = self._reserve(self.running)
        free = self.kv.num_free
        leaders: dict[tuple, Sequence] = {}
        while self.waiting:
            seq = self.waiting[0]
            if len(self.running) + len(admitted) >= self.cfg.max_running_requests:
                break
            adopted = seq.row is not None  # holds the KV a session's request left
            if not adopted and not self.kv.has_free_row():
                gained = self._drop_parked()  # its row is free now
                if gained is None:
                    break
                free += gained
            leader, match, shared = self._plan(seq, leaders)
            need = seq.num_tokens - seq.num_computed - shared  # tokens computed = slots taken
            if admitted and need > budget:
                break
            seq_reserve = self._future(seq, shared)
            locked, free = self._room(match, need + reserve + seq_reserve, free)
            if need + locked + reserve + seq_reserve > free:
                # Alone and idle, a request that fits the pool must run even without a reserve.
                if self.running or admitted or need + locked > free:
                    break
            self.waiting.popleft()
            if not adopted:
                self.kv.attach(seq, match)
            seq.leader = leader
            if leader is None and self.kv.prefix is not None and not seq.output_ids and not adopted:
                leaders.setdefault(_group_key(seq), seq)
            seq.status = Status.RUNNING
            admitted.append(seq)
            budget -= need
            free -= need + locked
            reserve += seq_reserve
        self.running.extend(admitted)
        self.version += bool(admitted)
        self.max_running = max(self.max_running, len(self.running))
        return admitted

    def _make_room_for_decode(self) -> list[Sequence]:
        """Free parked sessions' KV, then preempt the newest requests, until every decodable one
        gets a slot; returns those."""
        seqs = self._decodable()
        while seqs and self.kv.num_free < len(seqs):
            if self._drop_parked() is None:  # parked KV goes before running requests do
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
        seq.leader = None
        seq.adopted_kv = False  # recomputed densely from position 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._note_arrival()
        self.waiting.appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a request (finished or aborted) and free its KV."""
        if seq in self.running:
            self.running.remove(seq)
            self.version += 1
            self.kv.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.kv.release(seq)  # a session request waiting with adopted KV holds some

    def park(self, seq: Sequence) -> None:
        """A finished session request leaves the running set and keeps its KV (sessions.py)."""
        self.running.remove(seq)
        self.version += 1

    def _room(self, match, want: int, free: int) -> tuple[int, int]:
        """(slots locking `match` takes from the free room, the free room), after dropping
        parked sessions' KV until `want` more slots fit, or none is left."""
        while True:
            locked = self.kv.prefix.unlocked_on_path(match.node) if match is not None else 0
            if want + locked <= free:
                return locked, free
            gained = self._drop_parked()
            if gained is None:
                return locked, free
            free += gained

    def _drop_parked(self) -> int | None:
        """Free the least recently parked session request's KV, as a cache gives up its least
        recently used entry (that session's next request prefills its whole context): the free
        room gained, None when nothing is parked."""
        before = self.kv.num_free
        return self.kv.num_free - before if self.reclaim() else None

    def retract_all(self) -> None:
        for seq in reversed(list(self.running)):
            self.preempt(seq)
