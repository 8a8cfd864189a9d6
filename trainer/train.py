"""GRPO with sparse rollouts: ``python -m trainer.train --hf-checkpoint ... --prompt-data ...``.

Each rollout: prompts -> generate (in-process sglang-kvc engine or SGLang servers; logprobs are
π_sparse) -> rewards -> advantages -> dense π_old recompute -> sparse-rollout correction ->
optimizer steps -> weight sync -> log / eval / save. Launch with ``torchrun`` for several GPUs:
every data-parallel rank hosts an engine and generates its shard of each batch; all ranks then
hold the whole batch in single-engine order.

This module is the algorithm and nothing else. Two doors (docs/doors.md): the rollout side
(``rollout/side.py``) hands over a rollout ready to train and takes the weights back; the learner
(``learner/learner.py``) takes the rollout's batch and gives its metrics. Startup runs one way:
flags -> config (``run_config.py``) -> rollout side -> learner -> loop; ``startup/cli.py`` says
what the user sees when it ends, and ``tracking/step.py`` gathers one rollout's metrics.
"""

from __future__ import annotations

from .startup import cli, interrupt

if __name__ == "__main__":  # --help and flag errors before the imports below (torch, Megatron,
    _PARSED = cli.parse_early()  # the engine): they would take several times as long

import argparse  # noqa: E402 - after the early parse above
import contextlib
from pathlib import Path

from evaluation.progress import progress_bar

from .launch import phase
from .learner.learner import Learner, LearnerPaths
from .rollout.side import RestartHookFactory, RolloutSide, RolloutSpan
from .run_config import LoopConfig, RunConfig, engine_device, rank, run_config_from_args
from .tracking import StepMetrics, open_metrics_logger, peak_memory_metrics, print_summary


class Run:
    """One training run, built one way: the rollout side (engine processes, data), the learner
    (models, resume), the rollout side opened at the learner's rollout, the logs."""

    def __init__(self, cfg: RunConfig, restart_hook: RestartHookFactory | None = None):
        self.cfg, self.history = cfg, []
        self.rollouts = RolloutSide(cfg.rollout, cfg.algo.loss.kl_loss_coef, engine_device())
        try:
            self.learner = Learner(cfg.learner, cfg.algo, LearnerPaths(
                cfg.loop.save_dir, self.work_dir, cfg.loop.checkpoint), self.rollouts.needs_reference)
            self.start_rollout = self.rollouts.resume(self.learner.resume())
            self.rollouts.open(RolloutSpan(self.start_rollout, cfg.loop.num_rollout,
                                           cfg.tracking.log_dir, self.work_dir), restart_hook)
        except BaseException:
            self.rollouts.close()
            raise
        self.flags = {**cfg.flags, "rollout_server_urls": self.rollouts.server_urls}
        # the metrics of the steps after the checkpoint are logged again: each step once
        self.logger = (open_metrics_logger(cfg.tracking, config=self.flags,
                                           keep_through=self.start_rollout)
                       if rank() == 0 else None)

    @property
    def work_dir(self) -> Path:
        """Where the run keeps its converted checkpoint and weight-sync files."""
        return self.cfg.loop.save_dir or self.cfg.tracking.log_dir

    def rollout_step(self, rollout_id: int) -> dict:
        """One rollout, top to bottom: generate and shape, update, measure, push the weights."""
        m = StepMetrics()
        rollout = self.rollouts.next(rollout_id)
        m.time("time_rollout", rollout.wait_seconds)
        m.add("rollout", rollout.metrics)
        with self.rollouts.device_work():  # the engines' GPU work waits for the learner's
            step = self.learner.step(rollout.batch)
        m.add("time", step.times)
        m.add("rollout", self.rollouts.observe(rollout, step.mismatch))  # the sampler's budget
        m.add("rewards", rollout.rewards)
        m.add("prepare", step.prepare)
        m.add_train(step.train)
        sync = self.rollouts.push(self.learner.policy, rollout_id + 1)  # the next version
        m.time("time_sync", sync.pop("time_sync"))
        m.add("sync", sync)
        m.add("speed", step.speed)
        m.add("memory", peak_memory_metrics())
        return m.merged()

    def save(self, rollout_id: int) -> None:
        with self.rollouts.device_work(), \
                interrupt.doing(f"the save of checkpoint iteration {rollout_id}"):
            self.learner.save(rollout_id, self.rollouts.state(rollout_id), self.flags)

    def close(self) -> None:
        self.rollouts.close()
        if self.logger is not None:
            self.logger.close()


# --- the loop ----------------------------------------------------------------------------------
def train(cfg: RunConfig, restart_hook: RestartHookFactory | None = None) -> list[dict]:
    run = Run(cfg, restart_hook)
    try:
        why = run.learner.first_push_reason(run.start_rollout)
        if why is not None:  # the engines loaded --hf-checkpoint: make them serve the learner's
            why = f": {why}" if why else ""
            with phase(f"weights to the engine(s) ({cfg.rollout.weight_sync.mode}){why}"):
                run.rollouts.push(run.learner.policy, run.start_rollout)
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
            print_summary(run.history, cfg.tracking.log_dir)
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
            metrics.update(run.rollouts.evaluate(rollout_id + 1))
    if run.logger is not None:
        run.logger.log(rollout_id + 1, metrics)
    run.history.append({"rollout": rollout_id + 1, **metrics})
    return metrics


def _evaluate_start(run: Run) -> None:
    """The policy before any update, as step 0 (the baseline every eval curve starts from)."""
    with phase("evaluation before training"):
        metrics = run.rollouts.evaluate(0)
    if run.logger is not None:
        run.logger.log(0, metrics)


def _saves_after(loop: LoopConfig, done: int) -> bool:
    """Whether to checkpoint after ``done`` rollouts: every ``save_interval``, and the last."""
    every = loop.save_interval and done % loop.save_interval == 0
    return loop.save_dir is not None and bool(done == loop.num_rollout or every)


def main(argv=None, restart_hook: RestartHookFactory | None = None,
         parsed: argparse.Namespace | None = None) -> int:
    """``python -m trainer.train``: flags -> config -> the run, one way; ``startup/cli.py`` says
    what the user sees when it ends. ``parsed``: ``argv`` already parsed."""
    command = cli.Command(argv, parsed)
    with command:
        train(run_config_from_args(command.start()), restart_hook)
    return command.exit_code


if __name__ == "__main__":
    interrupt.exit(main(parsed=_PARSED))
