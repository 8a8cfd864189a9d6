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
import os
import sys
import threading
import time
from pathlib import Path

from .startup import interrupt
from .arguments import parse_args

if __name__ == "__main__":  # --help and flag errors before the imports below (torch, Megatron,
    interrupt.install()  # the engine): they would take several times as long
    _PARSED = parse_args(sys.argv[1:], prog=interrupt.prog("python -m trainer.train"))

import torch  # noqa: E402 - after the early parse above
import torch.distributed as dist  # noqa: E402
from evaluation.progress import progress_bar  # noqa: E402


from checkpoint_tools.model_config import CheckpointError

from .algorithms.adaptive_budget import BudgetController
from .algorithms.argparse_flags import AlgorithmConfig, config_from_args
from .launch import RendezvousError, init_parallel, parallel_config_from_args, phase, teardown
from .learner.checkpoint import (is_trainer_checkpoint, load_checkpoint, remove_partial,
                                 save_checkpoint)
from .learner.checkpoint_policy import CheckpointPolicy, checkpoint_policy_from_args
from .learner.checkpoint_space import report_space
from .learner.config import LearnerConfig, build_models, learner_config_from_args
from .learner.fused_old_logp import plan_old_logp
from .learner.grpo_update import RolloutBatch, gather_dp, mismatch_inputs, prepare_update, run_updates
from .learner.model_provider import rounds_checkpoint
from .learner.replay_cache import shared_replay_masks
from .learner.speed import generation_gpus, generation_timing, rollout_speed
from .rollout.config import RolloutSetup, rollout_setup_from_args
from .rollout.engines.factory import (Launched, RestartHookFactory, connect_restarts,
                                      launch_engines, weight_sync_for)
from .rollout.engines.interface import RolloutError
from .rollout.engines.processes import EngineProcessError
from .rollout.evaluation import EvalSetup, evaluate, write_rows
from .rollout.learner_batch import learner_batch
from .rollout.samples.data import DataError
from .rollout.samples.fidelity import fidelity_step
from .rollout.samples.generate import needs_reference
from .rollout.samples.shaping import training_rewards
from .rollout.source import RolloutGenerator, rollout_source, start_manager, tokens_per_s
from .tracking import (TrackingConfig, open_metrics_logger, peak_memory_metrics, print_summary,
                       tracking_config_from_args)

# A launcher that can replace engines passes a RestartHookFactory in (``ray/trainer_actor.py``).


@dataclasses.dataclass
class LoopConfig:
    num_rollout: int
    eval_interval: int | None = None  # evaluate every N rollouts
    save_dir: Path | None = None  # trainer checkpoints
    save_interval: int | None = None  # save every N rollouts (and always after the last)
    eval_before_train: bool = False  # evaluate the starting policy too, logged as step 0
    checkpoint: CheckpointPolicy = CheckpointPolicy()  # what a save holds, how many stay


@dataclasses.dataclass
class RunConfig:
    """One run, one config per package, each read from the flags by that package."""

    loop: LoopConfig
    rollout: RolloutSetup
    learner: LearnerConfig
    algo: AlgorithmConfig
    tracking: TrackingConfig
    flags: dict  # every flag as resolved: recorded in checkpoints and the metrics' config


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    args = _resume_from_save(args)
    loop = LoopConfig(args.num_rollout, args.eval_interval,
                      Path(args.save) if args.save else None, args.save_interval,
                      args.eval_before_train, checkpoint_policy_from_args(args))
    logs = loop.save_dir / "logs" if loop.save_dir else Path("runs/train")
    rollout, learner = rollout_setup_from_args(args), learner_config_from_args(args)
    # what the flags' defaults resolved to, as they were recorded before the configs did it
    flags = {**vars(args), "weight_sync": rollout.weight_sync.mode,
             "global_batch_size": learner.global_batch_size}
    return RunConfig(loop, rollout, learner, config_from_args(args),
                     tracking_config_from_args(args, default_dir=logs), flags=flags)


def _resume_from_save(args: argparse.Namespace) -> argparse.Namespace:
    """A ``--save`` folder that holds a trainer checkpoint is resumed, unless ``--load`` names a
    trainer checkpoint itself: the same command goes on after an interrupt (slime's idiom of
    ``--load`` = ``--save``; ``--load`` then only gives the first run's weights)."""
    if is_trainer_checkpoint(args.load) or not is_trainer_checkpoint(args.save):
        return args
    if _rank() == 0:
        print(f"[startup] --save {args.save} holds a checkpoint of this run: resuming from it "
              f"(pass another --save to start over)", flush=True)
    return argparse.Namespace(**{**vars(args), "load": args.save})


def with_engine_processes(cfg: RunConfig) -> tuple[Launched, RunConfig]:
    """What this rank launches before its models (``rollout/engines/factory.py``: its engine
    processes, or nothing) and ``cfg`` with the rollouts pointed at every engine's URL."""
    launched = launch_engines(cfg.rollout.engines, _engine_device())
    engines = launched.config
    return launched, dataclasses.replace(
        cfg, rollout=dataclasses.replace(cfg.rollout, engines=engines),
        flags={**cfg.flags, "rollout_server_urls": engines.server_urls})


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class Run:
    """What one training run holds: trainer, reference, rollout source, data, logs."""

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
        self.rollouts = start_manager(cfg.rollout, self.tokenizer, self.plugin,
                                      self.prompts.prompts, _engine_device())
        self.sync = weight_sync_for(cfg.rollout.weight_sync, cfg.rollout.engines,
                                    self.rollouts.engines, self.work_dir)
        connect_restarts(self.rollouts.engines, restart_hook, self.sync)
        self.generate = RolloutGenerator(self.rollouts, self.prompts, self.plan, self.budget)
        self.eval = EvalSetup(self.rollouts, self.eval_sets, self.plan, self.budget, self.log_dir,
                              write=_rank() == 0)
        self.source = rollout_source(self.rollouts, self.sync, self.generate,
                                     cfg.rollout.asynchrony, self.start_rollout,
                                     cfg.loop.num_rollout)  # after the hook: it may wrap the backend
        # the metrics of the steps after the checkpoint are logged again: each step once
        self.logger = (open_metrics_logger(cfg.tracking, config=cfg.flags,
                                           keep_through=self.start_rollout)
                       if _rank() == 0 else None)
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
        t, start = {}, time.perf_counter()
        prompts, result, sampled = self.source.get(rollout_id)
        if self.plan.debug_path and _rank() == 0:  # --save-debug-rollout-data
            write_rows(self.plan.debug_path.format(rollout_id=rollout_id), result.rows(prompts))
        stats = {**result.stats(), **sampled, **self.source.staleness(result, rollout_id)}
        # async: generation overlapped training; what is left is the wait for it
        t["time_rollout"] = max(1e-6, time.perf_counter() - start - stats["time_reward"])
        gen_seconds = self.source.generation_seconds(result, t["time_rollout"])
        stats["rollout_tokens_per_s"] = tokens_per_s(result, gen_seconds)
        shaped = training_rewards(result.traces, self.plan)
        batch = learner_batch(result, shaped, self.tokenizer.pad_token_id or 0,
                              self.algo.loss.kl_loss_coef)
        # one rollout's eviction masks: the reference, π_old and the update pack the same
        # micro-batches (one optimizer step) and build them once; dropped at the scope's end
        with self.source.device_work(), shared_replay_masks():
            prep, t["time_recompute"] = _timed(self._prepare, batch)
            steps, t["time_update"] = _timed(run_updates, self.trainer, batch, prep, self.algo.loss,
                                             self.cfg.learner.global_batch_size)
        stats.update(fidelity_step(self.budget, batch.dense, mismatch_inputs(batch, prep),
                                   result.gens))
        sync = self.source.push(self.trainer, f"rollout-{rollout_id + 1}")  # the next version
        t["time_sync"] = sync.pop("time_sync")
        train = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        return {**stats, **shaped.metrics, **prep.metrics, **{f"train/{k}": v for k, v in train.items()}, **sync,
                **t, **self._speed(batch, gen_seconds), **peak_memory_metrics(),
                "time_total": time.perf_counter() - start}

    def _speed(self, batch: RolloutBatch, gen_seconds: float) -> dict:
        """``perf/``: tokens/s and MFU per GPU of generation and each trainer phase."""
        gpus = generation_gpus(self.cfg.rollout.engines,
                               dist.get_world_size() if dist.is_initialized() else 1)
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
            return evaluate(self.eval, rollout_id)

    def save(self, rollout_id: int) -> None:
        if self.save_dir is None:
            return
        plain = {k: v for k, v in self.cfg.flags.items()
                 if isinstance(v, (int, float, str, bool, list, type(None)))}
        extra = {"rollout_id": rollout_id, "compress_budget": self.budget.budget,
                 "data": self.generate.data_states.get(rollout_id, self.prompts.state())}
        with self.source.device_work(), \
                interrupt.doing(f"the save of checkpoint iteration {rollout_id}"):
            save_checkpoint(self.trainer, self.save_dir, rollout_id, args=argparse.Namespace(**plain),
                            policy=self.cfg.loop.checkpoint, extra=extra)

    def close(self) -> None:
        self.source.close()
        self.rollouts.close()
        if self.logger is not None:
            self.logger.close()


def _timed(fn, *args):
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


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
                run.source.push(run.trainer, f"rollout-{run.start_rollout}")
        if cfg.loop.eval_before_train and run.start_rollout == 0:
            _evaluate_start(run)
        bar = progress_bar(range(run.start_rollout, cfg.loop.num_rollout), desc="rollouts",
                   disable=_rank() != 0, initial=run.start_rollout, total=cfg.loop.num_rollout)
        for rollout_id in bar:
            metrics = _one_rollout(run, rollout_id)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}",
                            len=f"{metrics['response_len_mean']:.0f}")
            if _saves_after(cfg.loop, rollout_id + 1):
                run.save(rollout_id + 1)
        if _rank() == 0 and run.history:  # plots and the first-vs-last table
            print_summary(run.history, run.log_dir)
        return run.history
    finally:
        run.close()


def _one_rollout(run: Run, rollout_id: int) -> dict:
    """A rollout step (the first one a startup phase), its eval when due, its metrics logged."""
    first = rollout_id == run.start_rollout
    with phase("first rollout (generate, reward, recompute, update, sync)") if first \
            else contextlib.nullcontext(), \
            interrupt.doing(f"rollout {rollout_id + 1} of {run.cfg.loop.num_rollout}"):
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
    """``python -m trainer.train``; ``parsed``: ``argv`` already parsed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():  # a Ray actor's may not be
        interrupt.install()
    args = parsed
    try:
        args = args or parse_args(argv, prog=interrupt.prog("python -m trainer.train"))
        return _main(args, restart_hook)
    except BaseException as e:  # noqa: BLE001 - after a signal, whatever it broke ends quietly
        if interrupt.received() is None or isinstance(e, SystemExit):
            raise
        save = args.save if args is not None else None
        interrupt.say(interrupt.report(save, _resume_command(argv)))
        return interrupt.exit_code()


def _resume_command(argv: list[str]) -> str:
    """The command that goes on from the last checkpoint: the one the user typed."""
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get(interrupt.COMMAND_ENV):
        return "the same torchrun command"
    return interrupt.command([sys.executable.rsplit("/", 1)[-1], "-m", "trainer.train", *argv])


def _main(args: argparse.Namespace, restart_hook: RestartHookFactory | None) -> int:
    try:
        init_parallel(parallel_config_from_args(args))
    except RendezvousError as e:  # the launch itself is wrong: say where, do not hang
        print(f"{_prog()}: error: {e}", file=sys.stderr, flush=True)
        return 1
    launched = None
    try:
        launched, cfg = with_engine_processes(run_config_from_args(args))
        train(cfg, launched.restart_hook(restart_hook))
    except (DataError, CheckpointError, EngineProcessError, RolloutError) as e:  # a message
        print(f"{_prog()}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if launched is not None:
            launched.stop()
        teardown()
    return 0


def _prog() -> str:
    return interrupt.prog("trainer.train")


if __name__ == "__main__":
    interrupt.exit(main(parsed=_PARSED))
