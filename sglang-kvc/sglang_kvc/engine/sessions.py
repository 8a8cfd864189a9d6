"""Sessions (SGLang's session API): a request continues an earlier request of its session from
the KV that request left, so each turn of a multi-turn sample prefills only its new tokens.

A finished session request is *parked*: it leaves the running set but keeps its slot-table row,
its slots (pool `used` and `peak_used` count them), its lock on the cached prompt, its
query-ring row and its eviction tracker. A request with `session_params = {"id", "rid"}` has as
prompt request `rid`'s context (prompt + output) followed by its own tokens. When the engine
thread takes it in, it *adopts* the parked KV: the row and slots become its own, `num_computed`
says where its uncomputed tokens start, and the scheduler prefills only those (the previous
request's last sampled token leads them when no step fed it). Under compression the adopted
KV is the compressed KV: budgets span the whole context, the new tokens are scored and evicted
like any other, the eviction tracker goes on over the whole context's positions, and
--compress-keep-prompt pins the chain's first prompt (`Sequence.first_prompt_len`); with
--compress-pin-turns it pins each turn's prompt instead (`Sequence.turn_head`: the adopted KV
and the new tokens), so only the turn's generated tokens are evicted.

A parked KV goes when its session closes, when the KV pool is released, or when the scheduler
needs its room (a waiting request that does not fit, a decode step short of slots: least
recently parked first, before any running request is preempted). A request
continuing it then (or a second continuation of one request: a branch) prefills its whole
context densely: the same tokens and positions, only slower (for a compressed chain its
eviction record says from where: `eviction_record_dense_from`).

State changes on the engine thread; callers' threads read it (`resolve`) under a lock.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from dataclasses import dataclass, field

from .io_struct import SessionParams
from .sequence import Sequence

_KV_FIELDS = ("row", "kv_len", "prefix_len", "prefix_node", "num_computed")


def check_open_args(capacity_of_str_len, session_id) -> None:
    """open_session's arguments (SGLang's; the capacity is accepted and unused)."""
    if not isinstance(capacity_of_str_len, int) or isinstance(capacity_of_str_len, bool) \
            or capacity_of_str_len < 0:
        raise ValueError("capacity_of_str_len must be a non-negative integer")
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise ValueError("session_id must be a non-empty string")


@dataclass
class Turn:
    """A finished request of a session; it holds its KV while `seq.row` is set."""
    seq: Sequence
    parked_at: int
    compressed: bool  # a compaction happened in this request or one it continues


@dataclass
class Session:
    id: str
    turns: dict[str, Turn] = field(default_factory=dict)  # request id -> finished request


@dataclass
class SessionContext:
    """What intake needs to build a session request's sequence."""
    session_id: str
    parent_rid: str | None
    ids: list[int]  # the context it continues (empty for a chain's first request)
    first_prompt_len: int | None  # the chain's first prompt (None: this request starts it)


class Sessions:
    def __init__(self, kv, scheduler):
        self.kv, self.scheduler = kv, scheduler
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._clock = itertools.count()

    # ---------------------------------------------------------------- callers' threads

    def resolve(self, params: SessionParams, wants_record: bool) -> SessionContext:
        """The context a request with `params` continues; ValueError for an unknown session or
        request (HTTP 400)."""
        with self._lock:
            session = self._sessions.get(params.id)
            if session is None:
                raise ValueError(f"unknown session id {params.id!r}: open it with open_session "
                                 f"(a closed session is gone)")
            if params.rid is None:
                return SessionContext(params.id, None, [], None)
            turn = session.turns.get(params.rid)
        if turn is None:
            raise ValueError(f"request {params.rid!r} is not a finished request of session "
                             f"{params.id!r} (unknown, still running, or aborted)")
        parent = turn.seq
        if wants_record and parent.eviction is None and turn.compressed:
            raise ValueError("return_eviction_record on a session request needs it on every "
                             "earlier request of the chain (their evictions were not recorded)")
        return SessionContext(params.id, params.rid, parent.prompt_ids + parent.output_ids,
                              parent.first_prompt_len)

    # ---------------------------------------------------------------- engine thread

    def open(self, session_id: str | None = None) -> str:
        sid = session_id or uuid.uuid4().hex
        with self._lock:
            if sid in self._sessions:
                raise ValueError(f"session id {sid!r} is already open")
            self._sessions[sid] = Session(sid)
        return sid

    def close(self, session_id: str) -> None:
        """Forget the session and free the KV its finished requests hold. Its requests still
        running finish as usual and free theirs."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise ValueError(f"unknown session id {session_id!r}")
        for turn in session.turns.values():
            self.kv.release(turn.seq)

    def open_many(self, count: int) -> list[str]:
        return [self.open() for _ in range(count)]

    def close_many(self, session_ids: list[str]) -> list[str]:
        """Close each open one of ``session_ids``; the ids that were not open."""
        unknown = []
        for sid in session_ids:
            try:
                self.close(sid)
            except ValueError:
                unknown.append(sid)
        return unknown

    def park(self, seq: Sequence, reason: dict) -> bool:
        """Keep a finishing request's KV for its session; False when it is not kept (an aborted
        request, a closed session): the caller frees it as usual."""
        session = self._sessions.get(seq.session_id)
        if session is None or reason.get("type") == "abort" or seq not in self.scheduler.running:
            return False
        parent = session.turns.get(seq.parent_rid) if seq.parent_rid else None
        compressed = seq.num_compressions > 0 or (parent is not None and parent.compressed)
        self.scheduler.park(seq)
        with self._lock:
            session.turns[seq.rid] = Turn(seq, next(self._clock), compressed)
        return True

    def adopt(self, seq: Sequence) -> None:
        """(A continuing request taken in.) Take over the parent's KV and eviction tracker; if
        the KV is gone, the request prefills its whole context (dense from there on)."""
        session = self._sessions.get(seq.session_id)
        turn = session.turns.get(seq.parent_rid) if session and seq.parent_rid else None
        if turn is None:
            return
        parent = turn.seq
        if seq.eviction is not None and parent.eviction is not None:
            # a copy: a later branch of the same parent continues the parent's own record
            seq.eviction = dataclasses.replace(parent.eviction, events=list(parent.eviction.events))
        if parent.row is None:
            if seq.eviction is not None:
                seq.eviction.on_reset(len(seq.prompt_ids) - 1)
            return
        for name in _KV_FIELDS:
            setattr(seq, name, getattr(parent, name))
        parent.row, parent.kv_len, parent.prefix_len, parent.prefix_node = None, 0, 0, None
        seq.adopted_kv = True
        seq.cached_tokens = seq.num_computed
        seq.turn_head = seq.kv_len + len(seq.prompt_ids) - seq.num_computed

    def parked(self) -> list[Sequence]:
        """The finished requests that still hold KV (engine thread)."""
        return [t.seq for s in self._sessions.values() for t in s.turns.values()
                if t.seq.row is not None]

    def drop_lru(self) -> bool:
        """Free the KV of the least recently parked request; False when none holds any."""
        held = [t for s in self._sessions.values() for t in s.turns.values() if t.seq.row is not None]
        if not held:
            return False
        self.kv.release(min(held, key=lambda t: t.parked_at).seq)
        return True

    def drop_all(self) -> None:
        """Free every parked KV (the pool is about to go); sessions stay open."""
        while self.drop_lru():
            pass

    def stats(self) -> dict:
        with self._lock:  # read from callers' threads (get_server_info)
            held = [t.seq for s in self._sessions.values() for t in s.turns.values()
                    if t.seq.row is not None]
        return {"open": len(self._sessions), "parked_requests": len(held),
                "parked_slots": sum(s.kv_len - s.prefix_len for s in held)}
