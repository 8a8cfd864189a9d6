"""A rollout's sessions reach the engine in batches (``multiturn/sessions.py``): all episodes'
sessions open in one call; episodes that end while a close call is under way are closed
together by the next one, not one call each (every call waits for an engine step boundary)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from trainer.rollout.engines.interface import Backend
from trainer.rollout.multiturn.episode import Episode
from trainer.rollout.multiturn.sessions import Sessions
from trainer.rollout.samples.data import Prompt


class HeldCloses(Backend):
    """Records every session call; the first close call waits until ``release`` is set."""

    has_sessions = True

    def __init__(self):
        self.opens, self.closes = [], []
        self.closing, self.release = threading.Event(), threading.Event()

    def open_sessions(self, count):
        self.opens.append(count)
        return [f"s{i}" for i in range(count)]

    def close_sessions(self, session_ids):
        self.closes.append(list(session_ids))
        self.closing.set()
        self.release.wait(timeout=30)


def _episodes(n: int) -> list[Episode]:
    return [Episode(Prompt("p", [1, 2], "", {}), 0, k) for k in range(n)]


def test_opens_are_one_call_and_closes_gather_while_one_is_under_way():
    backend = HeldCloses()
    sessions = Sessions(SimpleNamespace(backend=backend))
    episodes = _episodes(4)
    sessions.prepare(episodes)
    assert backend.opens == [4] and [e.session for e in episodes] == ["s0", "s1", "s2", "s3"]
    sessions.close(episodes[:1])
    assert backend.closing.wait(timeout=30)  # the first call is under way, held
    sessions.close(episodes[1:2])
    sessions.close(episodes[2:3])
    sessions.close(episodes[1:2])  # again: already closing, not sent twice
    sessions.close(episodes[3:])
    backend.release.set()
    sessions.finish(episodes)  # waits for them; every one is closed already
    assert backend.closes == [["s0"], ["s1", "s2", "s3"]]
    assert sessions.times.close_calls == 2


def test_finish_closes_what_is_still_open():
    """An error mid-rollout: the episodes that never ended are closed at the end, in one call."""
    backend = HeldCloses()
    backend.release.set()
    sessions = Sessions(SimpleNamespace(backend=backend))
    episodes = _episodes(3)
    sessions.prepare(episodes)
    sessions.finish(episodes)
    assert backend.closes == [["s0", "s1", "s2"]]
