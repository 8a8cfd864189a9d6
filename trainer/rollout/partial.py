"""Partial rollouts (slime's ``--partial-rollout``, AReaL's interruptible generation): requests
interrupted by a weight push keep their tokens and continue under the new weights.

``ResumableBackend`` wraps a backend (in-process engine or HTTP servers) with the same
``run`` / ``generate``. When a push aborts the requests in flight (``WeightGate.update`` calls
the engines' ``abort_request``), the aborted samples come back with the tokens generated so far;
the wrapper waits at the gate (``engine_use``) until the push is done, then sends them again as
one batch of new requests whose prompts are prompt + generated tokens, each for the tokens it
has left. The pieces are joined: token ids, behaviour log-probs (each token's from the weights
that sampled it) and one weight version per token (``Generation.token_versions``). Each sample
is returned exactly once, in its place.

KV compression: the continuation is a new request, so a compressed request's eviction state is
*recomputed*, not kept: the engine prefills prompt + generated tokens under the new weights and
compresses them as it compresses any prompt (``--sglang-compress-max-prompt``); the resumed
sample's later tokens see that cache, not the one it had before the interruption.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

from .engines.interface import Backend, Generation, RolloutConfig, SampleRequest
from .samples.staleness import head_version, token_versions, version_number

_SEED_STRIDE = 1_000_003  # a continuation's seed: away from every other sample's
SUBMIT_THREADS = 1024  # single requests in flight at once (an episode's turn each)


class ResumableBackend(Backend):
    def __init__(self, backend, gate, default_version: int = 0):
        self.backend, self.gate, self.default_version = backend, gate, default_version
        self._single: concurrent.futures.ThreadPoolExecutor | None = None  # submit()'s threads

    def __getattr__(self, name):  # everything else (urls, fault_metrics, ...) is the backend's
        return getattr(self.backend, name)

    @property
    def has_sessions(self) -> bool:
        return self.backend.has_sessions

    def open_session(self) -> str:
        return self.backend.open_session()

    def close_session(self, session_id: str) -> None:
        self.backend.close_session(session_id)

    def open_sessions(self, count: int) -> list[str]:
        return self.backend.open_sessions(count)

    def close_sessions(self, session_ids: list[str]) -> None:
        self.backend.close_sessions(session_ids)

    def submit(self, request: SampleRequest, cfg: RolloutConfig
               ) -> "concurrent.futures.Future[Generation]":
        """One request, resumed after a push as ``run`` resumes it, on a thread of its own (the
        engine batches it with the others in flight)."""
        if self._single is None:
            self._single = concurrent.futures.ThreadPoolExecutor(
                SUBMIT_THREADS, thread_name_prefix="resumable")
        return self._single.submit(lambda: self.run([request], cfg)[0])

    def run(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        with self.gate.engine_use():  # nothing is sent while a push is under way
            seen = self.gate.interruptions
            gens = self.backend.run(requests, cfg)
        segment = 1
        while todo := [k for k, g in enumerate(gens) if self._interrupted(g, requests[k], seen)]:
            with self.gate.engine_use():  # after the push that interrupted them
                seen = self.gate.interruptions
                rest = [continuation(requests[k], gens[k], segment) for k in todo]
                more = self.backend.run(rest, cfg)  # all of them as one batch
            for k, g in zip(todo, more):
                gens[k] = join(gens[k], g, self.default_version)
            segment += 1
        return gens

    def _interrupted(self, gen: Generation, request: SampleRequest, seen: int) -> bool:
        """Aborted by a push since ``seen``, with tokens left to generate (any other abort
        stays one)."""
        return gen.finish_reason == "abort" and self.gate.interruptions > seen \
            and len(gen.response_ids) < request.sampling_params["max_new_tokens"]


def continuation(request: SampleRequest, head: Generation, segment: int) -> SampleRequest:
    """The rest of an interrupted sample: prompt + its tokens so far, for the tokens left of
    its own budget (the config's, or a generate plug-in's per request), on a fresh seed."""
    params = dict(request.sampling_params)
    params["max_new_tokens"] -= len(head.response_ids)
    if params.get("sampling_seed") is not None:
        params["sampling_seed"] = (params["sampling_seed"] + segment * _SEED_STRIDE) % 2**31
    return dataclasses.replace(request, input_ids=request.input_ids + head.response_ids,
                               sampling_params=params)


def join(head: Generation, tail: Generation, default_version: int) -> Generation:
    """One sample from its interrupted head and the continuation under newer weights."""
    versions = token_versions(head, default_version) + \
        [version_number(tail.weight_version, default_version)] * len(tail.response_ids)
    meta = {**tail.meta, "resumed_at": head.meta.get("resumed_at", []) + [len(head.response_ids)],
            "start_version": head_version(head, default_version),
            "prompt_tokens": head.meta.get("prompt_tokens", tail.meta.get("prompt_tokens", 0))}
    return Generation(head.response_ids + tail.response_ids, head.logprobs + tail.logprobs,
                      head.text + tail.text, tail.finish_reason, tail.weight_version, meta,
                      versions)
