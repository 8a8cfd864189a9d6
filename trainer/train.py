"""GRPO with sparse rollouts: ``python -m trainer.train --hf-checkpoint ... --prompt-data ...``.

Each rollout: prompts -> generate (in-process sglang-kvc engine or SGLang servers; logprobs are
π_sparse) -> rewards -> advantages -> dense π_old recompute -> sparse-rollout correction ->
optimizer steps -> weight sync -> log / eval / save. Launch with ``torchrun`` for several GPUs:
every data-parallel rank hosts an engine and generates its shard of each batch
(``rollout/manager.py``); all ranks then hold the whole batch in single-engine order.
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

import torch
import torch.distributed as dist
from tqdm import tqdm

from checkpoint_tools import cpu_megatron
from checkpoint_tools.model_config import CheckpointError
from checkpoint_tools.torch_dist import read_common, read_tracker, resolve_checkpoint_dir

from .algorithms.argparse_flags import config_from_args
from .arguments import parse_args, server_args_from
from .launch import RendezvousError, detect_launch, init_process_group, phase, select_device
from .learner.checkpoint import load_checkpoint, save_checkpoint
from .learner.grpo_update import RolloutBatch, gather_dp, prepare_update, run_updates
from .learner.model_provider import ModelConfig
from .learner.packing import Sample
from .learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig
from .ray.supervisor import restart_hook_from_env
from .rollout.backends import HTTPRollout, RolloutConfig
from .rollout.data import DataError, PromptStream, load_prompts
from .rollout.generate import load_generate_plugin, needs_reference, parse_options
from .rollout.manager import RolloutManager
from .rollout.rewards import reward_config_from_args
from .rollout.sharding import placement
from .rollout.weight_sync import WeightSync


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _is_trainer_checkpoint(path: str | None) -> bool:
    if not path or not Path(path).exists() or read_tracker(path) in (None, "release"):
        return False
    return "extra" in read_common(resolve_checkpoint_dir(path))


class Run:
    """Everything one training run holds: trainer, reference, rollout manager, data, logs."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from .tracking import MetricsLogger

        self.args = args
        self.algo = config_from_args(args)
        with phase("tokenizer and prompt data") as info:
            self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
            self.prompts = PromptStream(
                load_prompts(args.prompt_data, self.tokenizer, input_key=args.input_key,
                             label_key=args.label_key, apply_chat_template=args.apply_chat_template,
                             max_prompt_len=args.max_prompt_len),
                seed=args.seed, shuffle=args.rollout_shuffle)
            self.eval_sets = self._load_eval_sets()
            info["detail"] = f"{len(self.prompts.prompts)} prompts, {len(self.eval_sets)} eval set(s)"
        self.plugin = load_generate_plugin(args.custom_generate_function_path,
                                           parse_options(args.custom_generate_args)) \
            if args.custom_generate_function_path else None
        self.save_dir = Path(args.save) if args.save else None
        self.log_dir = Path(args.log_dir or (self.save_dir / "logs" if self.save_dir else "runs/train"))
        resume = _is_trainer_checkpoint(args.load)  # reads the checkpoint's common.pt: once
        self.trainer, self.reference = self._build_models(resume)
        self.start_rollout = 0
        if resume:
            with phase(f"resume from {args.load}"):
                extra = load_checkpoint(self.trainer, args.load)
            self.start_rollout = int(extra.get("rollout_id", 0))
            self.prompts.load_state(extra.get("data", {"epoch": 0, "offset": 0}))
        self.rollout_cfg = RolloutConfig(
            max_response_len=args.rollout_max_response_len, temperature=args.rollout_temperature,
            top_p=args.rollout_top_p, top_k=args.rollout_top_k,
            stop_token_ids=args.rollout_stop_token_ids, seed=None,
            concurrency=args.rollout_concurrency)
        self.rollouts = self._start_rollouts()
        self.sync = WeightSync(args.weight_sync, engine=self.rollouts.engine,
                               http=self._control_backend(),
                               bucket_bytes=args.weight_sync_bucket_mb << 20,
                               disk_dir=(self.save_dir or self.log_dir) / "weight_sync",
                               hf_config_dir=args.hf_checkpoint,
                               master_address=args.weight_sync_master_address
                               or os.environ.get("MASTER_ADDR", "127.0.0.1"))
        self._restart_engines_with(restart_hook_from_env(resync=self.sync.resync))
        self.logger = MetricsLogger(self.log_dir, use_tensorboard=args.use_tensorboard,
                                    use_wandb=args.use_wandb, wandb_project=args.wandb_project,
                                    wandb_mode=args.wandb_mode,
                                    config=vars(args)) if _rank() == 0 else None
        self.history: list[dict] = []

    def _build_models(self, resume: bool):
        a = self.args
        cache = (self.save_dir or self.log_dir) / "hf_import"
        model_cfg = ModelConfig(hf_checkpoint=a.hf_checkpoint, load=None if resume else a.load,
                                attention_backend=a.attention_backend)
        trainer = PolicyTrainer(
            model_cfg,
            OptimConfig(lr=a.lr, min_lr=a.min_lr, lr_decay_style=a.lr_decay_style,
                        lr_warmup_iters=a.lr_warmup_iters, lr_decay_iters=a.lr_decay_iters,
                        weight_decay=a.weight_decay, adam_beta1=a.adam_beta1,
                        adam_beta2=a.adam_beta2, adam_eps=a.adam_eps, clip_grad=a.clip_grad),
            TrainConfig(max_tokens_per_gpu=a.max_tokens_per_gpu,
                        log_probs_chunk_size=a.log_probs_chunk_size,
                        temperature=a.rollout_temperature, seed=a.seed),
            cache_dir=cache, load_weights=not resume)
        reference = None
        if self.algo.loss.needs_ref_logp or needs_reference(self.plugin):
            ref_cfg = ModelConfig(hf_checkpoint=a.hf_checkpoint, load=a.ref_load,
                                  attention_backend=a.attention_backend, role="reference")
            reference = PolicyTrainer(ref_cfg, OptimConfig(), trainer.train_cfg, cache_dir=cache,
                                      trainable=False)
        return trainer, reference

    def _start_rollouts(self) -> RolloutManager:
        a = self.args
        remote = bool(a.rollout_server_urls)
        place = placement(remote)
        what = (f"{len(a.rollout_server_urls)} rollout server(s)" if remote
                else f"{place.num_generators} colocated rollout engine(s), one per data-parallel rank")
        with phase(f"start {what}") as info:
            manager = RolloutManager(
                place, reward_config_from_args(a),
                server_args=None if remote else server_args_from(a, device=_engine_device()),
                server_urls=a.rollout_server_urls, generate_plugin=self.plugin,
                tokenizer=self.tokenizer,
                offload=a.offload_rollout if a.offload_rollout is not None else torch.cuda.is_available())
            pool = manager.pool_stats()
            if pool:
                gib = pool["capacity"] * pool["bytes_per_slot"] / 2**30
                info["detail"] = f"KV pool of rank 0's engine: {pool['capacity']} tokens, {gib:.2f} GiB"
        return manager

    def _control_backend(self):
        """Where weight updates go: the servers, or the engines behind a router
        (``--rollout-engine-urls``), since a router forwards generation only."""
        backend = self.rollouts.backend if self.args.rollout_server_urls else None
        if backend is not None and self.args.rollout_engine_urls:
            return HTTPRollout(self.args.rollout_engine_urls)
        return backend

    def _restart_engines_with(self, hook) -> None:
        """Under ``python -m trainer.ray_job``, a dead engine is replaced by the job's supervisor
        and re-synced (``trainer/ray/supervisor.py``); elsewhere ``hook`` is None: it stays down."""
        if hook is not None and isinstance(self.rollouts.backend, HTTPRollout):
            self.rollouts.backend.on_engine_failure = hook

    def _load_eval_sets(self) -> dict:
        a = self.args
        pairs = zip(a.eval_prompt_data[::2], a.eval_prompt_data[1::2]) if a.eval_prompt_data else ()
        return {name: load_prompts(path, self.tokenizer, input_key=a.eval_input_key or a.input_key,
                                   label_key=a.eval_label_key or a.label_key,
                                   apply_chat_template=a.apply_chat_template)
                for name, path in pairs}

    # --- one rollout -------------------------------------------------------------------------
    def rollout_step(self, rollout_id: int) -> dict:
        a, n, t = self.args, self.args.n_samples_per_prompt, {}
        prompts = self.prompts.next_batch(a.rollout_batch_size)
        start = time.perf_counter()
        # per-sample seeds derived from (seed, rollout id): a resumed run samples exactly what
        # an uninterrupted one would have, with any number of engines
        cfg = dataclasses.replace(self.rollout_cfg,
                                  seed=(a.seed * 1_000_003 + rollout_id * 65_537) % 2**31)
        result = self.rollouts.run(prompts, n, cfg)
        if a.save_debug_rollout_data and _rank() == 0:
            _write_rows(Path(a.save_debug_rollout_data.format(rollout_id=rollout_id)),
                        result.rows(prompts))
        stats = result.stats()
        t["time_rollout"] = time.perf_counter() - start - stats["time_reward"]
        stats["rollout_tokens_per_s"] = sum(len(g.response_ids) for g in result.gens) / t["time_rollout"]
        batch = self._batch(result)
        samples = batch.samples

        mid = time.perf_counter()
        ref = None
        if self.reference is not None:
            ref = gather_dp(self.reference.compute_logprobs(samples), self.trainer)
        prep = prepare_update(self.trainer, batch, self.algo.advantage, self.algo.correction, ref)
        t["time_recompute"] = time.perf_counter() - mid
        mid = time.perf_counter()
        steps = run_updates(self.trainer, batch, prep, self.algo.loss, a.global_batch_size)
        t["time_update"] = time.perf_counter() - mid
        sync = self.push_weights(f"rollout-{rollout_id + 1}")
        t["time_sync"] = sync.pop("time_sync")
        train = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        return {**stats, **prep.metrics, **{f"train/{k}": v for k, v in train.items()}, **sync,
                **t, "time_total": time.perf_counter() - start}

    def _batch(self, result) -> RolloutBatch:
        """The learner's view of a rollout: every call a sample, advantages per trace."""
        a, traces = self.args, result.traces
        calls = [c for t in traces for c in t.calls]
        rewards = torch.tensor(result.rewards, dtype=torch.float32)
        shaped = (rewards + a.reward_bias) * a.reward_scaling
        plain = all(len(t.calls) == 1 and t.group is None for t in traces)
        return RolloutBatch(
            [Sample(c.prompt_ids, c.gen.response_ids or [self._pad_id()]) for c in calls], shaped,
            [torch.tensor(c.gen.logprobs or [0.0]) for c in calls],
            group_index=[t.group_label for t in traces],
            trace_index=None if plain else [i for i, t in enumerate(traces) for _ in t.calls],
            loss_weights=None if plain else [c.loss_weight for c in calls],
            kl_coefs=_kl_coefs(calls, self.algo.loss.kl_loss_coef))

    def push_weights(self, version: str) -> dict:
        """The trainer's weights to every engine; their next samples must report ``version``."""
        sync = self.sync.push(self.trainer, version)
        self.rollouts.version = version
        return sync

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    # --- eval / save -------------------------------------------------------------------------
    def evaluate(self, rollout_id: int) -> dict:
        a = self.args
        cfg = RolloutConfig(max_response_len=a.eval_max_response_len or a.rollout_max_response_len,
                            temperature=a.eval_temperature, top_p=a.eval_top_p,
                            stop_token_ids=a.rollout_stop_token_ids,
                            concurrency=a.rollout_concurrency)
        out = {}
        for name, prompts in self.eval_sets.items():
            result = self.rollouts.run(prompts, a.n_samples_per_eval_prompt, cfg, mode="eval")
            gens, final = result.gens, result.final_rewards()
            out[f"eval/{name}/score"] = sum(final) / len(final)
            out[f"eval/{name}/response_len"] = sum(len(g.response_ids) for g in gens) / len(gens)
            if _rank() == 0:  # what each engine answered, for people and tests to read
                _write_rows(self.log_dir / "eval_samples" / f"{name}_rollout{rollout_id}.jsonl",
                            result.rows(prompts))
        return out

    def save(self, rollout_id: int) -> None:
        if self.save_dir is None:
            return
        save_checkpoint(self.trainer, self.save_dir, rollout_id,
                        args=argparse.Namespace(**{k: v for k, v in vars(self.args).items()
                                                   if isinstance(v, (int, float, str, bool, list,
                                                                     type(None)))}),
                        extra={"rollout_id": rollout_id, "data": self.prompts.state()})

    def close(self) -> None:
        self.rollouts.close()
        if self.logger is not None:
            self.logger.close()


def _kl_coefs(calls, default: float) -> list[float] | None:
    """Per-call KL coefficients when a plug-in set any (None: --kl-loss-coef for all)."""
    if all(c.kl_coef is None for c in calls):
        return None
    return [default if c.kl_coef is None else c.kl_coef for c in calls]


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _engine_device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


def train(args: argparse.Namespace) -> list[dict]:
    from .tracking import format_summary, plot_metrics

    run = Run(args)
    a = args
    try:
        if run.start_rollout > 0 or a.load:
            # the engines loaded --hf-checkpoint; make them serve exactly the trainer's weights
            with phase(f"weights to the engine(s) ({a.weight_sync})"):
                run.push_weights(f"rollout-{run.start_rollout}")
        bar = tqdm(range(run.start_rollout, a.num_rollout), desc="rollouts",
                   disable=_rank() != 0, initial=run.start_rollout, total=a.num_rollout)
        for rollout_id in bar:
            first = rollout_id == run.start_rollout
            with phase("first rollout (generate, reward, recompute, update, sync)") if first \
                    else contextlib.nullcontext():
                metrics = run.rollout_step(rollout_id)
            if a.eval_interval and (rollout_id + 1) % a.eval_interval == 0:
                metrics.update(run.evaluate(rollout_id + 1))
            if run.logger is not None:
                run.logger.log(rollout_id + 1, metrics)
            run.history.append({"rollout": rollout_id + 1, **metrics})
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}",
                            len=f"{metrics['response_len_mean']:.0f}")
            last = rollout_id + 1 == a.num_rollout
            if a.save and (last or (a.save_interval and (rollout_id + 1) % a.save_interval == 0)):
                run.save(rollout_id + 1)
        if _rank() == 0 and run.history:
            plots = plot_metrics(run.log_dir / "metrics.jsonl", run.log_dir)
            print(format_summary(run.history, window=max(1, min(5, len(run.history) // 2))))
            print(f"metrics: {run.log_dir / 'metrics.jsonl'}; plots: {', '.join(p.name for p in plots)}")
        return run.history
    finally:
        run.close()


def init_parallel(args: argparse.Namespace) -> None:
    """Process groups from the launcher (or a private one), then Megatron's parallel state."""
    launch = detect_launch()
    model_parallel = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    if launch.world_size % model_parallel:
        raise RendezvousError(
            f"WORLD_SIZE={launch.world_size} is not divisible by --tensor-model-parallel-size x "
            f"--pipeline-model-parallel-size = {model_parallel}")
    how = "no launcher" if launch.launcher == "none" else f"{launch.launcher} launch"
    with phase(f"process group: rank 0 of {launch.world_size} ({how})") as info:
        device = select_device(launch)
        init_process_group(launch, rendezvous_timeout=args.rendezvous_timeout,
                           timeout_minutes=args.distributed_timeout_minutes)
        cpu_megatron.init_model_parallel(tp=args.tensor_model_parallel_size,
                                         pp=args.pipeline_model_parallel_size, seed=args.seed)
        info["detail"] = (f"{dist.get_backend()} on {device.type}, TP {args.tensor_model_parallel_size}"
                          f" x PP {args.pipeline_model_parallel_size} x DP "
                          f"{launch.world_size // model_parallel}")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        init_parallel(args)
    except RendezvousError as e:  # the launch itself is wrong: say where, do not hang
        print(f"trainer.train: error: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        train(args)
    except (DataError, CheckpointError) as e:  # the user's input: a message, not a traceback
        print(f"trainer.train: error: {e}", file=sys.stderr)
        return 2
    finally:
        cpu_megatron.teardown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
