"""GRPO with sparse rollouts: ``python -m trainer.train --hf-checkpoint ... --prompt-data ...``.

Each rollout: prompts -> generate (in-process sglang-kvc engine or SGLang servers; logprobs are
π_sparse) -> rewards -> advantages -> dense π_old recompute -> sparse-rollout correction ->
optimizer steps -> weight sync -> log / eval / save. Launch with ``torchrun`` for several GPUs:
every data-parallel rank hosts an engine and generates its shard of each batch
(``rollout/manager.py``); all ranks then hold the whole batch in single-engine order.

This module is the loop and nothing else: the command around it is ``startup/cli.py``, the
configuration ``run_config.py`` (each package reads its own flags), the rollout side is built by
``rollout/assembly.py``, and one rollout's metrics are gathered by ``tracking/step.py``.
"""

from __future__ import annotations

from .startup import cli, interrupt

if __name__ == "__main__":  # --help and flag errors before the imports below (torch, Megatron,
    _PARSED = cli.parse_early()  # the engine): they would take several times as long

import argparse  # noqa: E402 - after the early parse above
import contextlib
from pathlib import Path

from evaluation.progress import progress_bar

from .algorithms.adaptive_budget import BudgetController
from .launch import phase
from .learner.checkpoint import (is_trainer_checkpoint, load_checkpoint,
                                 remove_partial, save_checkpoint)
from .learner.checkpoint_space import report_space
from .learner.config import build_models
from .learner.fused_old_logp import plan_old_logp
from .learner.grpo_update import (RolloutBatch, gather_dp, mismatch_inputs,
                                  prepare_update, run_updates)
from .learner.model_provider import rounds_checkpoint
from .learner.replay_cache import shared_replay_masks
from .learner.speed import generation_timing, rollout_speed
from .rollout.assembly import RestartHookFactory, RolloutInputs, assemble_rollout
from .rollout.evaluation import evaluate, write_rows
from .rollout.learner_batch import learner_batch
from .rollout.samples.fidelity import fidelity_step
from .rollout.samples.generate import needs_reference
from .rollout.samples.shaping import training_rewards
from .rollout.source import tokens_per_s
from .run_config import (LoopConfig, RunConfig, engine_device, rank,
                         run_config_from_args, with_engine_processes)  # (benchmarks use them)
from .tracking import StepMetrics, open_metrics_logger, peak_memory_metrics, print_summary


class Run:
    """What one training run holds: trainer, reference, rollout side, data, logs."""

    def __init__(self, cfg: RunConfig, restart_hook: RestartHookFactory | None = None):
        self.cfg, self.algo, self.plan = cfg, cfg.algo, cfg.rollout.plan
        self.tokenizer, self.prompts, self.eval_sets = cfg.rollout.data.load()
        self.plugin = self.plan.load_plugin()
        self.budget = BudgetController(self.plan.adaptive)  # the sampler's budget (adaptive)
        self.save_dir, self.log_dir = cfg.loop.save_dir, cfg.tracking.log_dir
        if self.save_dir is not None:  # saves an interrupt cut short: never resumed, in the way
            remove_partial(self.save_dir)
        resume = is_trainer_checkpoint(cfg.learner.model.load)  # reads common.pt: once
        self.trainer, self.reference = build_models(
            cfg.learner, resume, self.algo.loss.needs_ref_logp or needs_reference(self.plugin),
            cache_dir=self.work_dir / "hf_import")
        if self.save_dir is not None:  # hours before the first save, while space can be freed
            report_space(self.save_dir, self.trainer, cfg.loop.checkpoint)
        self.start_rollout = self._resume() if resume else 0
        self.rollout = assemble_rollout(cfg.rollout, RolloutInputs(
            self.tokenizer, self.plugin, self.prompts, self.eval_sets, self.budget, self.log_dir,
            self.work_dir, rank() == 0, self.start_rollout, cfg.loop.num_rollout),
            restart_hook, engine_device())
        self.source = self.rollout.source
        # the metrics of the steps after the checkpoint are logged again: each step once
        self.logger = (open_metrics_logger(cfg.tracking, config=cfg.flags,
                                           keep_through=self.start_rollout)
                       if rank() == 0 else None)
        self.history: list[dict] = []

    @property
    def work_dir(self) -> Path:
        """Where the run keeps its converted checkpoint and weight-sync files."""
        return self.save_dir or self.log_dir

    def _resume(self) -> int:
        """The trainer, data position and rollout id of the checkpoint at ``--load``."""
        path = self.cfg.learner.model.load
        with phase(f"resume from {path}"):
            extra = load_checkpoint(self.trainer, path, policy=self.cfg.loop.checkpoint)
        start = int(extra.get("rollout_id", 0))
        self.prompts.load_state(extra.get("data", {"epoch": 0, "offset": 0}))
        self.budget.load(extra.get("compress_budget"))
        return start

    # --- one rollout -------------------------------------------------------------------------
    def rollout_step(self, rollout_id: int) -> dict:
        m = StepMetrics()
        prompts, result, sampled = self.source.get(rollout_id)
        if self.plan.debug_path and rank() == 0:  # --save-debug-rollout-data
            write_rows(self.plan.debug_path.format(rollout_id=rollout_id), result.rows(prompts))
        stats = {**result.stats(), **sampled, **self.source.staleness(result, rollout_id)}
        # async: generation overlapped training; what is left is the wait for it
        waited = m.time("time_rollout", max(1e-6, m.elapsed() - stats["time_reward"]))
        gen_seconds = self.source.generation_seconds(result, waited)
        m.add("rollout", stats, {"rollout_tokens_per_s": tokens_per_s(result, gen_seconds)})
        shaped = training_rewards(result.traces, self.plan)
        batch = learner_batch(result, shaped, self.tokenizer.pad_token_id or 0,
                              self.algo.loss.kl_loss_coef)
        # one rollout's eviction masks: the reference, π_old and the update pack the same
        # micro-batches (one optimizer step) and build them once; dropped at the scope's end
        with self.source.device_work(), shared_replay_masks():
            with m.timed("time_recompute"):
                prep = self._prepare(batch)
            with m.timed("time_update"):
                steps = run_updates(self.trainer, batch, prep, self.algo.loss,
                                    self.cfg.learner.global_batch_size)
        m.add("rollout", fidelity_step(self.budget, batch.dense, mismatch_inputs(batch, prep),
                                       result.gens))
        m.add("rewards", shaped.metrics)
        m.add("prepare", prep.metrics)
        m.add_train(steps)
        sync = self.source.push(self.trainer, f"rollout-{rollout_id + 1}")  # the next version
        m.time("time_sync", sync.pop("time_sync"))
        m.add("sync", sync)
        m.add("speed", self._speed(batch, gen_seconds))
        m.add("memory", peak_memory_metrics())
        return m.merged()

    def _speed(self, batch: RolloutBatch, gen_seconds: float) -> dict:
        """``perf/``: tokens/s and MFU per GPU of generation and each trainer phase."""
        gpus = self.rollout.generation_gpus
        gen = gpus and generation_timing(self.trainer.arch, batch.samples, gen_seconds, gpus)
        return rollout_speed((self.trainer, self.reference), gen or None)

    def _prepare(self, batch: RolloutBatch):
        """Advantages, the dense π_old (and reference) recompute, the sparse correction."""
        ref = None
        if self.reference is not None:
            sparse = self.trainer.train_cfg.train_sparse_policy  # KL between like policies
            ref = gather_dp(self.reference.compute_logprobs(batch.samples, sparse=sparse),
                            self.trainer)
        plan = plan_old_logp(self.trainer.train_cfg, batch, self.algo,  # fused when on-policy
                             self.cfg.learner.global_batch_size, self.source.max_staleness)
        return prepare_update(self.trainer, batch, self.algo.advantage, self.algo.correction, ref,
                              plan)

    # --- eval / save -------------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        with self.source.exclusive():
            return evaluate(self.rollout.eval, rollout_id)

    def save(self, rollout_id: int) -> None:
        if self.save_dir is None:
            return
        plain = {k: v for k, v in self.cfg.flags.items()
                 if isinstance(v, (int, float, str, bool, list, type(None)))}
        extra = {"rollout_id": rollout_id, "compress_budget": self.budget.budget,
                 "data": self.rollout.generate.data_states.get(rollout_id, self.prompts.state())}
        with self.source.device_work(), \
                interrupt.doing(f"the save of checkpoint iteration {rollout_id}"):
            save_checkpoint(self.trainer, self.save_dir, rollout_id, args=argparse.Namespace(**plain),
                            policy=self.cfg.loop.checkpoint, extra=extra)

    def close(self) -> None:
        self.rollout.close()
        if self.logger is not None:
            self.logger.close()


# --- the loop ----------------------------------------------------------------------------------
def train(cfg: RunConfig, restart_hook: RestartHookFactory | None = None) -> list[dict]:
    run = Run(cfg, restart_hook)
    try:
        rounded = rounds_checkpoint(cfg.learner.model)
        if run.start_rollout > 0 or cfg.learner.model.load or rounded:
            # the engines loaded --hf-checkpoint; make them serve exactly the trainer's weights
            why = f": {rounded}" if rounded else ""
            with phase(f"weights to the engine(s) ({cfg.rollout.weight_sync.mode}){why}"):
                run.source.push(run.trainer, f"rollout-{run.start_rollout}")
        if cfg.loop.eval_before_train and run.start_rollout == 0:
            _evaluate_start(run)
        bar = progress_bar(range(run.start_rollout, cfg.loop.num_rollout), desc="rollouts",
                           disable=rank() != 0, initial=run.start_rollout, total=cfg.loop.num_rollout)
        for rollout_id in bar:
            # named for the whole step, its logging included: a signal between the rollout and
            # the next one still says which rollout it struck (not "startup")
            with interrupt.doing(f"rollout {rollout_id + 1} of {cfg.loop.num_rollout}"):
                metrics = _one_rollout(run, rollout_id)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}",
                            len=f"{metrics['response_len_mean']:.0f}")
            if _saves_after(cfg.loop, rollout_id + 1):
                run.save(rollout_id + 1)
        if rank() == 0 and run.history:  # plots and the first-vs-last table
            print_summary(run.history, run.log_dir)
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
        with interrupt.doing(f"the evaluation after rollout {rollout_id + 1}"):
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


def main(argv=None, restart_hook: RestartHookFactory | None = None,
         parsed: argparse.Namespace | None = None) -> int:
    """``python -m trainer.train`` (``startup/cli.py``); ``parsed``: ``argv`` already parsed."""
    return cli.main(train, argv, restart_hook, parsed)


if __name__ == "__main__":
    interrupt.exit(main(parsed=_PARSED))
