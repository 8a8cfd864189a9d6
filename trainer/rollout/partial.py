"""Partial rollouts (slime's ``--partial-rollout``, AReaL's interruptible generation): requests
interrupted by a weight push keep their tokens and continue under the new weights.

``ResumableBackend`` wraps a backend (in-process engine or HTTP servers) with the same
``generate``. When a push aborts the requests in flight (``WeightGate.update`` calls the
engines' ``abort_request``), the aborted samples come back with the tokens generated so far;
the wrapper waits at the gate (``engine_use``) until the push is done, then sends each one again as a new
request whose prompt is prompt + generated tokens, for the tokens it has left. The pieces are
joined: token ids, behaviour log-probs (each token's from the weights that sampled it) and one
weight version per token (``Generation.token_versions``). Each sample is returned exactly once,
in its place.

KV compression: the continuation is a new request, so a compressed request's eviction state is
*recomputed*, not kept: the engine prefills prompt + generated tokens under the new weights and
compresses them as it compresses any prompt (``--sglang-compress-max-prompt``); the resumed
sample's later tokens see that cache, not the one it had before the interruption.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

from .backends import Generation, RolloutConfig
from .staleness import head_version, token_versions, version_number

_SEED_STRIDE = 1_000_003  # a continuation's seed: away from every other sample's


class ResumableBackend:
    def __init__(self, backend, gate, default_version: int = 0):
        self.backend, self.gate, self.default_version = backend, gate, default_version

    def __getattr__(self, name):  # everything else (urls, fault_metrics, ...) is the backend's
        return getattr(self.backend, name)

    def generate(self, prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                 ) -> list[Generation]:
        with self.gate.engine_use():  # nothing is sent while a push is under way
            seen = self.gate.interruptions
            gens = self.backend.generate(prompts, n, cfg, **overrides)
        segment = 1
        while todo := [k for k, g in enumerate(gens) if self._interrupted(g, cfg, overrides, seen)]:
            with self.gate.engine_use():  # after the push that interrupted them
                seen = self.gate.interruptions
                more = self._continue([prompts[k // n] for k in todo], [gens[k] for k in todo],
                                      [_seed(cfg, k, segment) for k in todo], cfg, overrides)
            for k, g in zip(todo, more):
                gens[k] = join(gens[k], g, self.default_version)
            segment += 1
        return gens

    def _interrupted(self, gen: Generation, cfg: RolloutConfig, overrides: dict, seen: int) -> bool:
        """Aborted by a push since ``seen``, with tokens left to generate (any other abort
        stays one)."""
        return gen.finish_reason == "abort" and len(gen.response_ids) < _budget(cfg, overrides) \
            and self.gate.interruptions > seen

    def _continue(self, prompts, gens, seeds, cfg, overrides) -> list[Generation]:
        """Each sample's rest as its own request, all in flight at once."""
        def one(i: int) -> Generation:
            left = _budget(cfg, overrides) - len(gens[i].response_ids)
            rest = dataclasses.replace(cfg, seed=seeds[i], max_response_len=left)
            more = {**overrides, "max_new_tokens": left} if "max_new_tokens" in overrides else overrides
            return self.backend.generate([list(prompts[i]) + gens[i].response_ids], 1, rest,
                                         **more)[0]

        with concurrent.futures.ThreadPoolExecutor(max(1, min(len(gens), 64))) as pool:
            return list(pool.map(one, range(len(gens))))


def _budget(cfg: RolloutConfig, overrides: dict) -> int:
    """The request's token budget: a generate plug-in's per-request ``max_new_tokens`` (an
    override, which the backends send in place of the config's) or the config's."""
    return overrides.get("max_new_tokens", cfg.max_response_len)


def _seed(cfg: RolloutConfig, index: int, segment: int) -> int | None:
    if cfg.seed is None:
        return None
    return (cfg.seed + index + segment * _SEED_STRIDE) % 2**31


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
