"""GRPO with sparse rollouts: ``python -m trainer.train --hf-checkpoint ... --prompt-data ...``.

Each rollout: prompts -> generate (in-process sglang-kvc engine or SGLang servers; logprobs are
π_sparse) -> rewards -> advantages -> dense π_old recompute -> sparse-rollout correction ->
optimizer steps -> weight sync -> log / eval / save. Launch with ``torchrun`` for several GPUs:
every data-parallel rank hosts an engine and generates its shard of each batch
(``rollout/manager.py``); all ranks then hold the whole batch in single-engine order.

Each package reads its own flags (``rollout/config.py``, ``learner/config.py``,
``algorithms/argparse_flags.py``, ``tracking.py``, ``launch.py``); this module only walks a
sample around the loop.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from checkpoint_tools import cpu_megatron
from checkpoint_tools.model_config import CheckpointError
from checkpoint_tools.torch_dist import read_common, read_tracker, resolve_checkpoint_dir

from .algorithms.adaptive_budget import BudgetController
from .algorithms.argparse_flags import AlgorithmConfig, config_from_args
from .arguments import parse_args
from .launch import RendezvousError, init_parallel, parallel_config_from_args, phase
from .learner.checkpoint import load_checkpoint, save_checkpoint
from .learner.config import LearnerConfig, learner_config_from_args
from .learner.fused_old_logp import plan_old_logp
from .learner.grpo_update import (RolloutBatch, gather_dp, mismatch_inputs, prepare_update,
                                  run_updates)
from .learner.model_provider import rounds_checkpoint
from .learner.packing import Sample
from .learner.policy_trainer import OptimConfig, PolicyTrainer
from .rollout.async_rollout import AsyncRollouts, gate_for
from .rollout.backends import HTTPRollout, RolloutError
from .rollout.capacity import capacity_line
from .rollout.config import RolloutSetup, rollout_setup_from_args
from .rollout.data import DataError
from .rollout.dynamic_sampling import DynamicSampler
from .rollout.engine_process import EngineProcessError
from .rollout.fidelity import apply_budget, dense_rows, fidelity_step
from .rollout.failover import RestartHook
from .rollout.generate import needs_reference
from .rollout.manager import RolloutManager
from .rollout.shaping import training_rewards
from .rollout.sharding import placement
from .rollout.staleness import rollout_staleness, version_number
from .rollout.weight_sync import WeightSync
from .tracking import (TrackingConfig, format_summary, open_metrics_logger, plot_metrics,
                       tracking_config_from_args)

# Given ``WeightSync.resync``, the hook that replaces a dead engine, or None (it stays down).
# A launcher that can replace engines passes one in (``ray/trainer_actor.py``).
RestartHookFactory = Callable[[Callable[[str], None]], RestartHook | None]


@dataclasses.dataclass
class LoopConfig:
    num_rollout: int
    eval_interval: int | None = None  # evaluate every N rollouts
    save_dir: Path | None = None  # trainer checkpoints
    save_interval: int | None = None  # save every N rollouts (and always after the last)
    eval_before_train: bool = False  # evaluate the starting policy too, logged as step 0


@dataclasses.dataclass
class RunConfig:
    """One run, one config per package, each read from the flags by that package."""

    loop: LoopConfig
    rollout: RolloutSetup
    learner: LearnerConfig
    algo: AlgorithmConfig
    tracking: TrackingConfig
    flags: dict  # every flag as parsed: recorded in checkpoints and the metrics' config


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    loop = LoopConfig(args.num_rollout, args.eval_interval,
                      Path(args.save) if args.save else None, args.save_interval,
                      args.eval_before_train)
    logs = loop.save_dir / "logs" if loop.save_dir else Path("runs/train")
    return RunConfig(loop, rollout_setup_from_args(args), learner_config_from_args(args),
                     config_from_args(args), tracking_config_from_args(args, default_dir=logs),
                     flags=dict(vars(args)))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _is_trainer_checkpoint(path: str | None) -> bool:
    if not path or not Path(path).exists() or read_tracker(path) in (None, "release"):
        return False
    return "extra" in read_common(resolve_checkpoint_dir(path))


class Run:
    """Everything one training run holds: trainer, reference, rollout manager, data, logs."""

    def __init__(self, cfg: RunConfig, restart_hook: RestartHookFactory | None = None):
        self.cfg, self.algo, self.plan = cfg, cfg.algo, cfg.rollout.plan
        self.tokenizer, self.prompts, self.eval_sets = self._load_data()
        self.plugin = self.plan.load_plugin()
        self.sampler = DynamicSampler(self.plan.dynamic) if self.plan.dynamic.enabled else None
        self.budget = BudgetController(self.plan.adaptive)  # the sampler's budget (adaptive)
        self.save_dir, self.log_dir = cfg.loop.save_dir, cfg.tracking.log_dir
        resume = _is_trainer_checkpoint(cfg.learner.model.load)  # reads common.pt: once
        self.trainer, self.reference = self._build_models(resume)
        self.start_rollout = self._resume() if resume else 0
        self.rollouts = self._start_rollouts()
        self.sync = self._weight_sync()
        self._restart_engines_with(restart_hook(self.sync.resync) if restart_hook else None)
        self.gate = gate_for(self.rollouts, cfg.rollout.asynchrony, self.start_rollout)
        self.producer, self._data_states = None, {}  # async: the generation thread
        self.logger = open_metrics_logger(cfg.tracking, config=cfg.flags) if _rank() == 0 else None
        self.history: list[dict] = []

    def _load_data(self):
        from transformers import AutoTokenizer

        data = self.cfg.rollout.data
        with phase("tokenizer and prompt data") as info:
            tokenizer = AutoTokenizer.from_pretrained(data.tokenizer_path)
            prompts, eval_sets = data.prompt_stream(tokenizer), data.eval_sets(tokenizer)
            info["detail"] = f"{len(prompts.prompts)} prompts, {len(eval_sets)} eval set(s)"
        return tokenizer, prompts, eval_sets

    @property
    def work_dir(self) -> Path:
        """Where the run keeps its converted checkpoint and weight-sync files."""
        return self.save_dir or self.log_dir

    def _build_models(self, resume: bool):
        cfg, cache = self.cfg.learner, self.work_dir / "hf_import"
        trainer = PolicyTrainer(cfg.policy_model(resume), cfg.optim, cfg.train, cache_dir=cache,
                                load_weights=not resume)
        if not (self.algo.loss.needs_ref_logp or needs_reference(self.plugin)):
            return trainer, None
        return trainer, PolicyTrainer(cfg.reference_model(), OptimConfig(), trainer.train_cfg,
                                      cache_dir=cache, trainable=False)

    def _resume(self) -> int:
        """The trainer, data position and rollout id of the checkpoint at ``--load``."""
        path = self.cfg.learner.model.load
        with phase(f"resume from {path}"):
            extra = load_checkpoint(self.trainer, path)
        start = int(extra.get("rollout_id", 0))
        self.prompts.load_state(extra.get("data", {"epoch": 0, "offset": 0}))
        self.budget.load(extra.get("compress_budget"))
        return start

    def _start_rollouts(self) -> RolloutManager:
        engines = self.cfg.rollout.engines
        place = placement(engines.remote, engines.per_gpu)
        what = (f"{len(engines.server_urls)} rollout server(s)" if engines.remote
                else f"{place.num_generators} colocated rollout engine(s), one per "
                     + ("GPU" if engines.per_gpu else "data-parallel replica"))
        with phase(f"start {what}") as info:
            manager = RolloutManager(
                place, self.plan.reward,
                server_args=None if engines.remote else engines.server_args(_engine_device()),
                server_urls=engines.server_urls, generate_plugin=self.plugin,
                tokenizer=self.tokenizer, offload=engines.offloads())
            pool = manager.pool_stats()
            info["detail"] = pool and f"{_pool_detail(pool)}; {self._capacity(pool['capacity'])}"
        return manager

    def _capacity(self, pool_tokens: int) -> str:
        """The pool in samples at the configured response length, dense and compressed."""
        flags = self.cfg.rollout.engines.engine_flags
        algo = flags.get("compress_algorithm")
        algo = None if str(algo).lower() in ("none", "") else algo
        lens = [len(p.input_ids) for p in self.prompts.prompts[:1000]] or [0]
        return capacity_line(pool_tokens, round(sum(lens) / len(lens)),
                             self.plan.sampling.max_response_len, algo,
                             flags.get("compress_max_prompt"), flags.get("compress_divide_length"),
                             bool(flags.get("compress_keep_prompt")))

    def _weight_sync(self) -> WeightSync:
        ws, engines = self.cfg.rollout.weight_sync, self.cfg.rollout.engines
        return WeightSync(ws.mode, engine=self.rollouts.engine,
                          http=engines.control_backend(self.rollouts.backend),
                          bucket_bytes=ws.bucket_bytes, disk_dir=self.work_dir / "weight_sync",
                          hf_config_dir=engines.model_path,
                          group_timeout_s=ws.timeout_s, master_address=ws.master_address
                          or os.environ.get("MASTER_ADDR", "127.0.0.1"))

    def _restart_engines_with(self, hook) -> None:
        """Under ``python -m trainer.ray_job``, a dead engine is replaced by the job's supervisor
        and re-synced (``trainer/ray/supervisor.py``); elsewhere ``hook`` is None: it stays down."""
        if hook is not None and isinstance(self.rollouts.backend, HTTPRollout):
            self.rollouts.backend.on_engine_failure = hook

    # --- one rollout -------------------------------------------------------------------------
    def rollout_step(self, rollout_id: int) -> dict:
        t, start = {}, time.perf_counter()
        prompts, result, sampled = self._generated(rollout_id)
        self._write_debug_rows(rollout_id, result, prompts)
        stats = {**result.stats(), **sampled, **self._staleness(result, rollout_id)}
        # async: generation overlapped training; what is left is the wait for it
        t["time_rollout"] = max(1e-6, time.perf_counter() - start - stats["time_reward"])
        stats["rollout_tokens_per_s"] = _tokens_per_s(result, t["time_rollout"] if self.gate is None
                                                      else None)
        shaped = training_rewards(result.traces, self.plan)
        batch = self._batch(result, shaped)
        with self.device_work():
            prep, t["time_recompute"] = _timed(self._prepare, batch)
            steps, t["time_update"] = _timed(run_updates, self.trainer, batch, prep, self.algo.loss,
                                             self.cfg.learner.global_batch_size)
        stats.update(fidelity_step(self.budget, batch.dense, mismatch_inputs(batch, prep),
                                   result.gens))
        sync = self.push_weights(f"rollout-{rollout_id + 1}")
        t["time_sync"] = sync.pop("time_sync")
        train = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        return {**stats, **shaped.metrics, **prep.metrics, **{f"train/{k}": v for k, v in train.items()}, **sync,
                **t, "time_total": time.perf_counter() - start}

    def _generated(self, rollout_id: int):
        """This rollout, generated now or (async) by the generation thread."""
        if self.gate is None:
            return self._generate(rollout_id)
        if self.producer is None:  # started here: after any first push of the weights
            self.producer = AsyncRollouts(self._generate, self.gate,
                                          range(rollout_id, self.cfg.loop.num_rollout)).start()
        return self.producer.get(rollout_id)

    def _staleness(self, result, rollout_id: int) -> dict:
        """Async: how many versions each sample lags the weights it trains (bound checked)."""
        if self.gate is None:
            return {}
        return {**rollout_staleness(result.gens, rollout_id, self.gate.max_staleness,
                                    self.start_rollout),
                "rollout/interruptions": float(self.gate.interruptions)}

    def _generate(self, rollout_id: int):
        """The rollout's prompts and result (and dynamic sampling's counts, when it is on)."""
        self._data_states[rollout_id] = self.prompts.state()  # where a resume must start it
        n = self.plan.n_samples
        sampling = apply_budget(self.budget, self.plan.sampling_for(rollout_id))
        if self.sampler is not None:
            return self.sampler.collect(self.rollouts, self.prompts, self.plan.batch_size, n,
                                        sampling)
        prompts = self.prompts.next_batch(self.plan.batch_size)
        return prompts, self.rollouts.run(prompts, n, sampling), {}

    def _prepare(self, batch: RolloutBatch):
        """Advantages, the dense π_old (and reference) recompute, the sparse correction."""
        ref = None
        if self.reference is not None:
            sparse = self.trainer.train_cfg.train_sparse_policy  # KL between like policies
            ref = gather_dp(self.reference.compute_logprobs(batch.samples, sparse=sparse),
                            self.trainer)
        plan = plan_old_logp(self.trainer.train_cfg, batch, self.algo,  # fused when on-policy
                             self.cfg.learner.global_batch_size, self.gate and self.gate.max_staleness)
        return prepare_update(self.trainer, batch, self.algo.advantage, self.algo.correction, ref,
                              plan)

    def _write_debug_rows(self, rollout_id: int, result, prompts) -> None:
        if self.plan.debug_path and _rank() == 0:
            _write_rows(Path(self.plan.debug_path.format(rollout_id=rollout_id)),
                        result.rows(prompts))

    def _batch(self, result, shaped) -> RolloutBatch:
        """The learner's view of a rollout: every call a sample, advantages per trace."""
        traces = result.traces
        calls = [c for t in traces for c in t.calls]
        plain = all(len(t.calls) == 1 and t.group is None for t in traces)
        return RolloutBatch(
            [_sample(c, self._pad_id()) for c in calls], shaped.rewards,
            [torch.tensor(c.gen.logprobs or [0.0]) for c in calls],
            group_index=[t.group_label for t in traces],
            trace_index=None if plain else [i for i, t in enumerate(traces) for _ in t.calls],
            loss_weights=None if plain else [c.loss_weight for c in calls],
            kl_coefs=_kl_coefs(calls, self.algo.loss.kl_loss_coef), keep=shaped.keep,
            dense=dense_rows([c.gen for c in calls]))

    def push_weights(self, version: str) -> dict:
        """The trainer's weights to every engine; their next samples must report ``version``."""
        if self.gate is None:
            sync = self.sync.push(self.trainer, version)
            self.rollouts.version = version
            return sync
        with self.gate.update(version_number(version, self.start_rollout)), self.device_work():
            return self.sync.push(self.trainer, version)

    def device_work(self):
        """Async with an engine in this process: the training thread's GPU work must not overlap
        the engine thread's CUDA-graph captures (``sglang_kvc.engine.cuda_graph.CaptureGate``)."""
        if self.gate is None or self.rollouts.engine is None:
            return contextlib.nullcontext()
        from sglang_kvc.engine.cuda_graph import CAPTURE_GATE

        return CAPTURE_GATE.device_work()

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    # --- eval / save -------------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        with self.gate.exclusive() if self.gate else contextlib.nullcontext():
            return self._evaluate(rollout_id)

    def _evaluate(self, rollout_id: int) -> dict:
        out = {}
        for name, prompts in self.eval_sets.items():
            for suffix, sampling, n in self.plan.eval_configs():
                sampling = apply_budget(self.budget, sampling)  # compressed: the training budget
                result = self.rollouts.run(prompts, n, sampling, mode="eval")
                out.update(eval_metrics(f"eval/{name}{suffix}", result))
                if _rank() == 0:  # what each engine answered, for people and tests to read
                    _write_rows(self.log_dir / "eval_samples" / f"{name}{suffix}_rollout{rollout_id}.jsonl",
                                result.rows(prompts))
        return out

    def save(self, rollout_id: int) -> None:
        if self.save_dir is None:
            return
        plain = {k: v for k, v in self.cfg.flags.items()
                 if isinstance(v, (int, float, str, bool, list, type(None)))}
        with self.device_work():
            save_checkpoint(self.trainer, self.save_dir, rollout_id, args=argparse.Namespace(**plain),
                            extra={"rollout_id": rollout_id, "compress_budget": self.budget.budget,
                                   "data": self._data_states.get(rollout_id, self.prompts.state())})

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self.rollouts.close()
        if self.logger is not None:
            self.logger.close()


def _timed(fn, *args):
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def _tokens_per_s(result, waited: float | None) -> float:
    """Generated tokens per second of generation: the wait for it (synchronous), or the
    slowest engine's generation time (async: it overlapped training)."""
    seconds = waited if waited is not None else max(s.seconds for s in result.shards)
    return sum(len(g.response_ids) for g in result.gens) / max(seconds, 1e-6)


def _sample(call, pad_id: int) -> Sample:
    """A call as the learner's sample, with its eviction record (replay) when it has one; an
    empty response becomes one pad token, whose record would not fit: replayed densely."""
    gen = call.gen
    record = gen.eviction_record if gen.response_ids else None
    return Sample(call.prompt_ids, gen.response_ids or [pad_id], record,
                  gen.meta.get("eviction_record_dense_from"))


def _kl_coefs(calls, default: float) -> list[float] | None:
    """Per-call KL coefficients when a plug-in set any (None: --kl-loss-coef for all)."""
    if all(c.kl_coef is None for c in calls):
        return None
    return [default if c.kl_coef is None else c.kl_coef for c in calls]


def eval_metrics(prefix: str, result) -> dict:
    """Mean final score, mean response length, and pass@n (a prompt counts when any of its n
    answers scored > 0) when several samples were drawn per prompt."""
    final = [t for t in result.traces if t.final]
    gens = result.gens
    out = {f"{prefix}/score": sum(t.reward for t in final) / len(final),
           f"{prefix}/response_len": sum(len(g.response_ids) for g in gens) / len(gens)}
    by_prompt: dict[int, bool] = {}
    for t in final:
        by_prompt[t.prompt_index] = by_prompt.get(t.prompt_index, False) or t.reward > 0
    n = len(final) // max(1, len(by_prompt))
    if n > 1:
        out[f"{prefix}/pass@{n}"] = sum(by_prompt.values()) / len(by_prompt)
    return out


def _pool_detail(pool: dict | None) -> str | None:
    if not pool:
        return None
    gib = pool["capacity"] * pool["bytes_per_slot"] / 2**30
    return f"KV pool of rank 0's engine: {pool['capacity']} tokens, {gib:.2f} GiB"


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _engine_device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


# --- the loop ----------------------------------------------------------------------------------
def train(cfg: RunConfig, restart_hook: RestartHookFactory | None = None) -> list[dict]:
    run = Run(cfg, restart_hook)
    try:
        rounded = rounds_checkpoint(cfg.learner.model)
        if run.start_rollout > 0 or cfg.learner.model.load or rounded:
            # the engines loaded --hf-checkpoint; make them serve exactly the trainer's weights
            why = f": {rounded}" if rounded else ""
            with phase(f"weights to the engine(s) ({cfg.rollout.weight_sync.mode}){why}"):
                run.push_weights(f"rollout-{run.start_rollout}")
        if cfg.loop.eval_before_train and run.start_rollout == 0:
            _evaluate_start(run)
        bar = tqdm(range(run.start_rollout, cfg.loop.num_rollout), desc="rollouts",
                   disable=_rank() != 0, initial=run.start_rollout, total=cfg.loop.num_rollout)
        for rollout_id in bar:
            metrics = _one_rollout(run, rollout_id)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}",
                            len=f"{metrics['response_len_mean']:.0f}")
            if _saves_after(cfg.loop, rollout_id + 1):
                run.save(rollout_id + 1)
        _summarize(run)
        return run.history
    finally:
        run.close()


def _one_rollout(run: Run, rollout_id: int) -> dict:
    """A rollout step (the first one a startup phase), its eval when due, its metrics logged."""
    first = rollout_id == run.start_rollout
    with phase("first rollout (generate, reward, recompute, update, sync)") if first \
            else contextlib.nullcontext():
        metrics = run.rollout_step(rollout_id)
    interval = run.cfg.loop.eval_interval
    if interval and (rollout_id + 1) % interval == 0:
        metrics.update(run.evaluate(rollout_id + 1))
    if run.logger is not None:
        run.logger.log(rollout_id + 1, metrics)
    run.history.append({"rollout": rollout_id + 1, **metrics})
    return metrics


def _evaluate_start(run: Run) -> None:
    """The policy before any update, as step 0 (the baseline every eval curve starts from)."""
    with phase("evaluation before training"):
        metrics = run.evaluate(0)
    if run.logger is not None:
        run.logger.log(0, metrics)


def _saves_after(loop: LoopConfig, done: int) -> bool:
    """Whether to checkpoint after ``done`` rollouts: every ``save_interval``, and the last."""
    every = loop.save_interval and done % loop.save_interval == 0
    return loop.save_dir is not None and bool(done == loop.num_rollout or every)


def _summarize(run: Run) -> None:
    """Rank 0: plots of the logged metrics and the first-vs-last table."""
    if _rank() != 0 or not run.history:
        return
    plots = plot_metrics(run.log_dir / "metrics.jsonl", run.log_dir)
    print(format_summary(run.history, window=max(1, min(5, len(run.history) // 2))))
    print(f"metrics: {run.log_dir / 'metrics.jsonl'}; plots: {', '.join(p.name for p in plots)}")


def main(argv=None, restart_hook: RestartHookFactory | None = None) -> int:
    args = parse_args(argv)
    try:
        init_parallel(parallel_config_from_args(args))
    except RendezvousError as e:  # the launch itself is wrong: say where, do not hang
        print(f"trainer.train: error: {e}", file=sys.stderr, flush=True)
        return 1
    fleet = None
    try:
        fleet = engine_processes(args)
        train(run_config_from_args(args), restart_hook or (fleet and fleet.restart_hook))
    except (DataError, CheckpointError, EngineProcessError, RolloutError) as e:  # a message
        print(f"trainer.train: error: {e}", file=sys.stderr)
        return 2
    finally:
        if fleet is not None:
            fleet.stop()
        cpu_megatron.teardown()
    return 0


def engine_processes(args: argparse.Namespace):
    """``--rollout-engine-process`` (this rank's engine as a child process) or
    ``--rollout-num-gpus`` (engines on GPUs of their own, started by rank 0): engine_process.py."""
    if not (args.rollout_engine_process or args.rollout_num_gpus):
        return None
    from .rollout.engine_process import start_engine_processes

    log_dir = Path(args.log_dir or args.save or ".")
    with phase("start the rollout engine process(es)") as info:
        fleet = start_engine_processes(args, log_dir, _engine_device())
        info["detail"] = ", ".join(args.rollout_server_urls) + f"; logs under {log_dir / 'engines'}"
    return fleet


if __name__ == "__main__":
    raise SystemExit(main())
