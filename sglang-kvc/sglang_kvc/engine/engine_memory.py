"""``Engine``'s memory calls (SGLang's ``release_memory_occupation`` / ``resume_memory_occupation``):
free the KV pool, the weights or the CUDA graphs while the trainer needs the GPU, and bring them
back. Both run on the engine thread between steps; releasing refuses while requests are in
flight. Kept apart from engine.py so ``Engine`` itself holds only building the engine and
serving requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model_runner import ModelRunner
    from .scheduler import Scheduler
    from .sessions import Sessions
    from .step_loop import StepLoop

_MEMORY_TAGS = {"kv_cache", "weights", "cuda_graph"}


class EngineMemory:
    """Mixed into ``Engine``, which sets the parts these calls reach: ``loop`` (the engine
    thread), ``scheduler`` (what is in flight), ``sessions`` (parked KV) and ``runner`` (what
    holds the memory)."""

    loop: StepLoop
    scheduler: Scheduler
    sessions: Sessions
    runner: ModelRunner

    def release_memory(self, tags: list[str] | None = None) -> None:
        self.loop.call(self._release, set(tags or _MEMORY_TAGS))

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self.loop.call(self._resume, set(tags or _MEMORY_TAGS))

    def _check_tags(self, tags: set[str]) -> None:
        unknown = tags - _MEMORY_TAGS
        if unknown:
            raise ValueError(f"unknown memory tag(s): {sorted(unknown)}")

    def _release(self, tags: set[str]) -> None:
        self._check_tags(tags)
        if self.scheduler.running or self.scheduler.waiting:
            raise ValueError("cannot release memory while requests are in flight")
        if "kv_cache" in tags:
            self.sessions.drop_all()  # their next requests prefill their whole context
        self.runner.release(tags)

    def _resume(self, tags: set[str]) -> None:
        self._check_tags(tags)
        self.runner.resume(tags)
