"""Which server a single request goes to (``HTTPRollout.submit``): a session's requests to the
server that opened it (its KV lives there: a turn elsewhere would prefill the whole history
again, or fail), every other request round-robin."""

from __future__ import annotations

import itertools
import threading


class Routes:
    """Sticky slots by session id; the next slot in turn for everything else."""

    def __init__(self, size: int):
        self.size = size
        self._turn = itertools.count()
        self._sessions: dict[str, int] = {}  # session id -> slot of the server holding it
        self._lock = threading.Lock()

    def next_slot(self) -> int:
        with self._lock:
            return next(self._turn) % self.size

    def open(self, session_id: str, slot: int) -> None:
        with self._lock:
            self._sessions[session_id] = slot

    def slot_of(self, session_id: str) -> int:
        """The server holding ``session_id`` (ValueError if no open session has that id)."""
        with self._lock:
            if session_id not in self._sessions:
                raise ValueError(f"session {session_id!r} is not open on any rollout server")
            return self._sessions[session_id]

    def close(self, session_id: str) -> int | None:
        """The slot the session was on (None: unknown), forgotten."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def for_request(self, session_params: dict | None) -> int:
        if session_params and session_params.get("id"):
            return self.slot_of(session_params["id"])
        return self.next_slot()
