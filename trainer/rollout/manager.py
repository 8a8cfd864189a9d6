"""This rank's part of a rollout: its engine's shard of the prompts, their rewards, and the
gathered global batch with its statistics.

    manager = RolloutManager(place, reward_cfg, engines)  # built by assembly.py
    result = manager.run(prompts, n_samples, RolloutConfig(...))  # same result on every rank
    result.gens, result.rewards, result.stats()

Each generating rank scores its own samples (the grader runs where the samples are), then all
ranks receive every shard in engine order. A generate plug-in (``rollout/samples/generate.py``)
decides the requests and returns the traces: the default one samples each prompt ``n`` times,
one call each (``samples/single_turn.py``); its siblings are a user's
(``--custom-generate-function-path``) and multi-turn episodes (``--env-path``). The manager
knows none of them: a plug-in's own metrics come from its ``metrics(traces)``.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from .engines.interface import Engines, Generation, RolloutConfig, RolloutError
from .engines.sharding import Placement, gather_shards, shard_bounds
from .samples.data import Prompt
from .samples.generate import GenerateContext, rollout_metrics, run_plugin
from .samples.kv_stats import compression_stats
from .samples.rewards import RewardConfig, RewardInput, RewardModel
from .samples.traces import Trace

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Shard:
    """What one engine produced for one rollout."""

    traces: list[Trace]  # rewards filled in, prompt indices global
    seconds: float  # generation wall time on that engine
    reward_seconds: float
    kv_pool: dict | None = None  # that engine's pool: peak_used, bytes_per_slot, capacity
    plugin_stats: dict = dataclasses.field(default_factory=dict)
    faults: dict = dataclasses.field(default_factory=dict)  # HTTP: rollout/engine_failures, ...
    decode: dict = dataclasses.field(default_factory=dict)  # colocated: this rollout's decode counters
    error: str | None = None  # the shard failed: every rank raises it (none waits for it)

    @property
    def gens(self) -> list[Generation]:
        return [c.gen for t in self.traces for c in t.calls]


@dataclasses.dataclass
class RolloutResult:
    shards: list[Shard]
    plugin: object = None  # the generate plug-in that made it (its metrics(traces))

    @property
    def traces(self) -> list[Trace]:
        return [t for s in self.shards for t in s.traces]

    @property
    def gens(self) -> list[Generation]:
        """Every call's generation, in trace order."""
        return [g for s in self.shards for g in s.gens]

    @property
    def rewards(self) -> list[float]:
        """One per trace."""
        return [t.reward for t in self.traces]

    def final_rewards(self) -> list[float]:
        """The rewards of the traces that are answers (all of them without a plug-in)."""
        return [t.reward for t in self.traces if t.final]

    def rows(self, prompts: list[Prompt]) -> list[dict]:
        """One JSON-ready row per call, in global order, naming its trace and engine."""
        rows, traces = [], 0
        for e, shard in enumerate(self.shards):
            for t in shard.traces:
                rows += [_row(len(rows) + k, e, traces, prompts[t.prompt_index], t, c)
                         for k, c in enumerate(t.calls)]
                traces += 1
        return rows

    def stats(self) -> dict:
        out = {**sample_stats(self.gens, self.rewards), **compression_stats(self.gens),
               **engine_stats(self.shards)}
        if any(s.plugin_stats for s in self.shards):
            out.update(plugin_stats(self.shards, self.traces))
        return {**out, **rollout_metrics(self.plugin, self.traces)}


def _row(index: int, engine: int, trace_id: int, prompt: Prompt, trace: Trace, call) -> dict:
    g = call.gen
    return {"index": index, "engine": engine, "trace": trace_id, "role": call.role,
            "prompt": prompt.text, "prompt_ids": call.prompt_ids, "label": prompt.label,
            "response": g.text, "response_ids": g.response_ids, "logprobs": g.logprobs,
            "reward": trace.reward, "final": trace.final, "loss_weight": call.loss_weight,
            "finish_reason": g.finish_reason, "weight_version": g.weight_version,
            "token_versions": g.token_versions}


def plugin_stats(shards: list[Shard], traces: list[Trace]) -> dict:
    calls = sum(len(t.calls) for t in traces)
    final = [t.reward for t in traces if t.final]
    return {"rollout/traces": float(len(traces)), "rollout/calls_per_trace": calls / len(traces),
            "rollout/final_reward_mean": sum(final) / max(1, len(final)),
            "rollout/requests_truncated": float(sum(s.plugin_stats.get("truncated", 0)
                                                    for s in shards))}


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
            "aborted": float(sum(g.finish_reason == "abort" for g in gens)),
            # samples preempted (their KV dropped and recomputed) because the pool ran out
            "rollout_preemptions": float(sum(g.meta.get("num_preemptions", 0) for g in gens)),
            # prompt tokens served from the engine's prefix cache (a group's prompt prefilled once)
            "prefix_hit_fraction": sum(g.meta.get("cached_tokens", 0) for g in gens)
            / max(sum(g.meta.get("prompt_tokens", 0) for g in gens), 1),
            **tail_stats(gens)}


def tail_stats(gens: list[Generation]) -> dict:
    """The long tail: the share of the rollout spent after 90% of its samples had finished
    (latencies from submission, so a wave submitted at once is measured from one start)."""
    lat = sorted(g.meta["e2e_latency"] for g in gens if g.meta.get("e2e_latency") is not None)
    if not lat or lat[-1] <= 0:
        return {}
    p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))]
    return {"rollout_tail_fraction": (lat[-1] - p90) / lat[-1]}


def engine_stats(shards: list[Shard]) -> dict:
    """Per-engine sample counts and tokens/s, the slowest engine's reward time, pool peaks."""
    out = {"time_reward": max(s.reward_seconds for s in shards)}
    for i, s in enumerate(shards):
        tokens = sum(len(g.response_ids) for g in s.gens)
        out[f"rollout_engine{i}/samples"] = float(len(s.gens))
        out[f"rollout_engine{i}/tokens_per_s"] = tokens / s.seconds if s.seconds > 0 else 0.0
    for key, count in ((k, v) for s in shards for k, v in {**s.faults, **s.decode}.items()):
        out[key] = out.get(key, 0.0) + count
    if out.get("rollout/decode_steps"):
        out["rollout/decode_ms_per_step"] = 1e3 * (out["rollout/decode_host_s"] + out[
            "rollout/decode_gpu_wait_s"]) / out["rollout/decode_steps"]
    pools = [s.kv_pool for s in shards if s.kv_pool]
    if pools:
        out["kv_pool_peak_used"] = float(max(p["peak_used"] for p in pools))
        out["kv_pool_peak_bytes"] = float(max(p["peak_used"] * p["bytes_per_slot"] for p in pools))
        out["kv_pool_capacity"] = float(min(p["capacity"] for p in pools))
    return out


class RolloutManager:
    """Generation on this rank through its ``Engines`` (``engines/factory.py``: an in-process
    engine, servers, or none on ranks that only train; ``assembly.py`` builds the manager)."""

    def __init__(self, place: Placement, reward_cfg: RewardConfig, engines: Engines, *,
                 generate_plugin=None, tokenizer=None):
        self.place, self.engines = place, engines
        self.rewards = RewardModel(reward_cfg) if place.generates else None
        self.version: str | None = None  # the weight version the engine(s) must report
        self.plugin, self.tokenizer = generate_plugin, tokenizer  # None: the single-turn default
        self._context_length: int | None = None  # asked of the engine once, on first use
        self._decode_seen: dict = {}  # decode_counters() at the end of the last rollout

    def run(self, prompts: list[Prompt], n: int, cfg: RolloutConfig, mode: str = "train"
            ) -> RolloutResult:
        """The whole batch's traces and rewards, in prompt order, on every rank."""
        shard = self._guarded_shard(prompts, n, cfg, mode) if self.place.generates else None
        shards = gather_shards(shard, self.place)
        failed = [f"engine {i}: {s.error}" for i, s in enumerate(shards) if s.error]
        if failed:  # on every rank, so that none is left waiting in the next collective
            raise RolloutError("rollout failed on " + "; ".join(failed))
        return RolloutResult(shards, self.plugin)

    def _guarded_shard(self, prompts: list[Prompt], n: int, cfg: RolloutConfig, mode: str
                       ) -> Shard:
        """This rank's shard, or one that carries its error to every rank through the gather: a
        rank that raised alone would leave the others in the gather until its timeout."""
        try:
            return self._shard(prompts, n, cfg, mode)
        except Exception as e:  # noqa: BLE001 - re-raised on every rank by run()
            log.error("rollout engine %s: shard failed", self.place.index, exc_info=e)
            return Shard([], 0.0, 0.0, error=f"{type(e).__name__}: {e}")

    def _shard(self, prompts: list[Prompt], n: int, cfg: RolloutConfig, mode: str) -> Shard:
        start, stop = shard_bounds(len(prompts), self.place.num_generators, self.place.index)
        local = prompts[start:stop]
        if cfg.seed is not None:  # seeds by global sample index: same samples on any engine count
            cfg = dataclasses.replace(cfg, seed=cfg.seed + start * n)
        with self.engines.kv_memory():
            begin = time.perf_counter()
            traces, extra = self._generate(local, n, cfg, mode) if local else ([], {})
            seconds = time.perf_counter() - begin
        gens = [c.gen for t in traces for c in t.calls]
        _check_complete(gens)
        self._check_version(gens)
        begin = time.perf_counter()
        self.score(local, traces)
        for t in traces:
            t.prompt_index += start
            t.group = None if t.group is None else ("shard", start, t.group)  # unique over shards
        return Shard(traces, seconds, time.perf_counter() - begin, self.pool_stats(), extra,
                     self.engines.fault_metrics(), self._decode_deltas())

    def _decode_deltas(self) -> dict:
        """This rollout's share of the engine's decode counters (``Engines.decode_counters``)."""
        now = self.engines.decode_counters()
        before, self._decode_seen = self._decode_seen, now
        return {k: float(v - before.get(k, 0)) for k, v in now.items()}

    def _generate(self, local: list[Prompt], n: int, cfg: RolloutConfig, mode: str):
        ctx = GenerateContext(self.engines, cfg, self.tokenizer, self.rewards, mode=mode,
                              context_length=self.context_length)
        traces = run_plugin(self.plugin, ctx, local, n)
        return traces, ctx.stats()

    def score(self, prompts: list[Prompt], traces: list[Trace]) -> None:
        """Fill in the rewards of traces the plug-in did not score itself."""
        todo = [t for t in traces if t.reward is None]
        inputs = [RewardInput(prompt=prompts[t.prompt_index].text, response=t.text,
                              label=prompts[t.prompt_index].label,
                              metadata=prompts[t.prompt_index].metadata) for t in todo]
        for t, r in zip(todo, self.rewards.score(inputs) if inputs else []):
            t.reward = r

    def context_length(self) -> int | None:
        """Tokens a request may span (prompt + generation), when the engine says."""
        if self._context_length is None:
            self._context_length = self._ask_context_length() or 0
        return self._context_length or None

    def _ask_context_length(self) -> int | None:
        if getattr(self.plugin, "context_length", None):  # the plug-in may set it (stock servers)
            return int(self.plugin.context_length)
        return self.engines.context_length()

    def pool_stats(self) -> dict | None:
        """The KV pool of this rank's engine, or of the fullest server; None where none says."""
        return self.engines.pool()

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
        self.engines.close()


def _check_complete(gens: list[Generation]) -> None:
    """No aborted sample leaves a rollout: an engine error was re-issued by the backend and
    a push's interruption resumed (partial rollouts); one still aborted would train as an
    empty or cut answer."""
    aborted = [g for g in gens if g.finish_reason == "abort"]
    if aborted:
        reason = aborted[0].meta.get("finish_reason")
        why = reason.get("message") if isinstance(reason, dict) else reason
        raise RolloutError(f"{len(aborted)} of {len(gens)} samples came back aborted "
                           f"(first: {why})")
