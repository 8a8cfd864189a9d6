"""This rank's part of a rollout: its engine's shard of the prompts, their rewards, and the
gathered global batch with its statistics.

    manager = RolloutManager(place, reward_cfg, server_args=..., offload=True)  # colocated engine
    result = manager.run(prompts, n_samples, RolloutConfig(...))  # same result on every rank
    result.gens, result.rewards, result.stats()

Each generating rank scores its own samples (the grader runs where the samples are), then all
ranks receive every shard in engine order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from .backends import EngineRollout, Generation, HTTPRollout, RolloutConfig
from .data import Prompt
from .rewards import RewardConfig, RewardInput, RewardModel
from .sharding import Placement, gather_shards, shard_bounds


@dataclasses.dataclass
class Shard:
    """What one engine produced for one rollout."""

    gens: list[Generation]
    rewards: list[float]
    seconds: float  # generation wall time on that engine
    reward_seconds: float
    kv_pool: dict | None = None  # that engine's pool: peak_used, bytes_per_slot, capacity


@dataclasses.dataclass
class RolloutResult:
    shards: list[Shard]

    @property
    def gens(self) -> list[Generation]:
        return [g for s in self.shards for g in s.gens]

    @property
    def rewards(self) -> list[float]:
        return [r for s in self.shards for r in s.rewards]

    def rows(self, prompts: list[Prompt], n: int) -> list[dict]:
        """One JSON-ready row per sample, in global order, naming the engine that made it."""
        engines = [e for e, s in enumerate(self.shards) for _ in s.gens]
        return [{"index": i, "engine": e, "prompt": prompts[i // n].text,
                 "prompt_ids": prompts[i // n].input_ids, "label": prompts[i // n].label,
                 "response": g.text, "response_ids": g.response_ids, "logprobs": g.logprobs,
                 "reward": r, "finish_reason": g.finish_reason, "weight_version": g.weight_version}
                for i, (e, g, r) in enumerate(zip(engines, self.gens, self.rewards))]

    def stats(self) -> dict:
        return {**sample_stats(self.gens, self.rewards), **compression_stats(self.gens),
                **engine_stats(self.shards)}


def sample_stats(gens: list[Generation], rewards: list[float]) -> dict:
    import torch

    lengths = [len(g.response_ids) for g in gens]
    r = torch.tensor(rewards, dtype=torch.float64)
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std()) if len(r) > 1 else 0.0,
            "accuracy": float((r > 0).double().mean()),
            "response_len_mean": sum(lengths) / len(lengths),
            # a dense sample holds prompt + response KV slots: its peak, next to kv_peak_slots_*
            "prompt_len_mean": sum(g.meta.get("prompt_tokens", 0) for g in gens) / len(gens),
            "response_len_max": float(max(lengths)),
            "response_truncated_fraction": sum(g.finish_reason == "length" for g in gens) / len(gens),
            "aborted": float(sum(g.finish_reason == "abort" for g in gens))}


def compression_stats(gens: list[Generation]) -> dict:
    comp = [g.meta["compression"] for g in gens if g.meta.get("compression")]
    if not comp:
        return {}
    mean = lambda key: sum(c.get(key, 0) for c in comp) / len(comp)  # noqa: E731
    return {"kv_compressions_per_sample": mean("num_compressions"),
            "kv_tokens_evicted_per_sample": mean("tokens_evicted"),
            "kv_peak_slots_per_sample": mean("peak_kv_slots"),
            "kv_peak_slots_max": float(max(c.get("peak_kv_slots", 0) for c in comp))}


def engine_stats(shards: list[Shard]) -> dict:
    """Per-engine sample counts and tokens/s, the slowest engine's reward time, pool peaks."""
    out = {"time_reward": max(s.reward_seconds for s in shards)}
    for i, s in enumerate(shards):
        tokens = sum(len(g.response_ids) for g in s.gens)
        out[f"rollout_engine{i}/samples"] = float(len(s.gens))
        out[f"rollout_engine{i}/tokens_per_s"] = tokens / s.seconds if s.seconds > 0 else 0.0
    pools = [s.kv_pool for s in shards if s.kv_pool]
    if pools:
        out["kv_pool_peak_used"] = float(max(p["peak_used"] for p in pools))
        out["kv_pool_peak_bytes"] = float(max(p["peak_used"] * p["bytes_per_slot"] for p in pools))
        out["kv_pool_capacity"] = float(min(p["capacity"] for p in pools))
    return out


class RolloutManager:
    """Generation on this rank: a colocated engine (``server_args``), remote servers
    (``server_urls``, global rank 0 only), or nothing (ranks that only train)."""

    def __init__(self, place: Placement, reward_cfg: RewardConfig, *, server_args=None,
                 server_urls: list[str] | None = None, offload: bool = False):
        self.place = place
        self.engine = self.backend = self.rewards = None
        if place.generates:
            self.engine, self.backend = _start_backend(server_args, server_urls,
                                                       progress=place.index == 0)
            self.rewards = RewardModel(reward_cfg)
        self.offload = offload and self.engine is not None
        self.version: str | None = None  # the weight version the engine(s) must report

    def run(self, prompts: list[Prompt], n: int, cfg: RolloutConfig) -> RolloutResult:
        """The whole batch's samples and rewards, in prompt order, on every rank."""
        shard = self._shard(prompts, n, cfg) if self.place.generates else None
        return RolloutResult(gather_shards(shard, self.place))

    def _shard(self, prompts: list[Prompt], n: int, cfg: RolloutConfig) -> Shard:
        start, stop = shard_bounds(len(prompts), self.place.num_generators, self.place.index)
        local = prompts[start:stop]
        if cfg.seed is not None:  # seeds by global sample index: same samples on any engine count
            cfg = dataclasses.replace(cfg, seed=cfg.seed + start * n)
        with self.kv_memory():
            begin = time.perf_counter()
            gens = self.backend.generate([p.input_ids for p in local], n, cfg) if local else []
            seconds = time.perf_counter() - begin
        self._check_version(gens)
        begin = time.perf_counter()
        rewards = self.score(local, gens, n)
        return Shard(gens, rewards, seconds, time.perf_counter() - begin, self.pool_stats())

    def score(self, prompts: list[Prompt], gens: list[Generation], n: int) -> list[float]:
        inputs = [RewardInput(prompt=prompts[i // n].text, response=g.text,
                              label=prompts[i // n].label, metadata=prompts[i // n].metadata)
                  for i, g in enumerate(gens)]
        return self.rewards.score(inputs) if inputs else []

    @contextlib.contextmanager
    def kv_memory(self):
        """The colocated engine's KV pool exists only while it generates (when offloading)."""
        if self.offload:
            self.engine.resume_memory(["kv_cache"])
        try:
            yield
        finally:
            if self.offload:
                self.engine.release_memory(["kv_cache"])

    def pool_stats(self) -> dict | None:
        if self.engine is None:
            return None
        pool = self.engine.get_server_info()["kv_pool"]
        return {k: pool[k] for k in ("peak_used", "bytes_per_slot", "capacity")}

    def _check_version(self, gens: list[Generation]) -> None:
        if self.version is None:
            return
        stale = {g.weight_version for g in gens} - {self.version}
        if stale:
            raise RuntimeError(f"rollout used weight version(s) {sorted(map(str, stale))}, "
                               f"expected {self.version}: the weight sync did not take effect")

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self.engine is not None:
            self.engine.shutdown()


def _start_backend(server_args, server_urls, progress: bool):
    if server_urls:
        return None, HTTPRollout(server_urls)
    from sglang_kvc.engine import Engine

    engine = Engine(server_args=server_args)
    return engine, EngineRollout(engine, progress=progress)
