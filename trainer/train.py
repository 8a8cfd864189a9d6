"""GRPO with sparse rollouts: ``python -m trainer.train --hf-checkpoint ... --prompt-data ...``.

Each rollout: prompts -> generate (in-process sglang-kvc engine or SGLang servers; logprobs are
π_sparse) -> rewards -> advantages -> dense π_old recompute -> sparse-rollout correction ->
optimizer steps -> weight sync -> log / eval / save. Launch with ``torchrun`` for several GPUs;
rank 0 drives the rollout and broadcasts the batch.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from .learner.checkpoint import load_checkpoint, save_checkpoint
from .learner.grpo_update import RolloutBatch, gather_dp, prepare_update, run_updates
from .learner.model_provider import ModelConfig
from .learner.packing import Sample
from .learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig
from .rollout.backends import EngineRollout, HTTPRollout, RolloutConfig
from .rollout.data import DataError, Prompt, PromptStream, load_prompts
from .rollout.weight_sync import WeightSync


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _broadcast(obj):
    box = [obj]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _is_trainer_checkpoint(path: str | None) -> bool:
    if not path or not Path(path).exists() or read_tracker(path) in (None, "release"):
        return False
    return "extra" in read_common(resolve_checkpoint_dir(path))


class Run:
    """Everything one training run holds: trainer, reference, rollout backend, data, logs."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from .rollout.rewards import RewardModel, reward_config_from_args
        from .tracking import MetricsLogger

        self.args = args
        self.algo = config_from_args(args)
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.prompts = PromptStream(
            load_prompts(args.prompt_data, self.tokenizer, input_key=args.input_key,
                         label_key=args.label_key, apply_chat_template=args.apply_chat_template,
                         max_prompt_len=args.max_prompt_len),
            seed=args.seed, shuffle=args.rollout_shuffle)
        self.save_dir = Path(args.save) if args.save else None
        self.log_dir = Path(args.log_dir or (self.save_dir / "logs" if self.save_dir else "runs/train"))
        resume = _is_trainer_checkpoint(args.load)
        cache = (self.save_dir or self.log_dir) / "hf_import"
        model_cfg = ModelConfig(hf_checkpoint=args.hf_checkpoint,
                                load=None if resume else args.load,
                                attention_backend=args.attention_backend)
        self.trainer = PolicyTrainer(
            model_cfg,
            OptimConfig(lr=args.lr, min_lr=args.min_lr, lr_decay_style=args.lr_decay_style,
                        lr_warmup_iters=args.lr_warmup_iters, lr_decay_iters=args.lr_decay_iters,
                        weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
                        adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                        clip_grad=args.clip_grad),
            TrainConfig(max_tokens_per_gpu=args.max_tokens_per_gpu,
                        log_probs_chunk_size=args.log_probs_chunk_size,
                        temperature=args.rollout_temperature, seed=args.seed),
            cache_dir=cache, load_weights=not resume)
        self.reference = None
        if self.algo.loss.needs_ref_logp:
            ref_cfg = ModelConfig(hf_checkpoint=args.hf_checkpoint, load=args.ref_load,
                                  attention_backend=args.attention_backend)
            self.reference = PolicyTrainer(ref_cfg, OptimConfig(), self.trainer.train_cfg,
                                           cache_dir=cache, trainable=False)
        self.start_rollout = 0
        if resume:
            extra = load_checkpoint(self.trainer, args.load)
            self.start_rollout = int(extra.get("rollout_id", 0))
            self.prompts.load_state(extra.get("data", {"epoch": 0, "offset": 0}))
        self.rewards = RewardModel(reward_config_from_args(args)) if _rank() == 0 else None
        self.rollout_cfg = RolloutConfig(
            max_response_len=args.rollout_max_response_len, temperature=args.rollout_temperature,
            top_p=args.rollout_top_p, top_k=args.rollout_top_k,
            stop_token_ids=args.rollout_stop_token_ids, seed=None,
            concurrency=args.rollout_concurrency)
        self.engine, self.backend = self._start_backend()
        self.sync = WeightSync(args.weight_sync, engine=self.engine,
                               http=self.backend if isinstance(self.backend, HTTPRollout) else None,
                               bucket_bytes=args.weight_sync_bucket_mb << 20,
                               disk_dir=(self.save_dir or self.log_dir) / "weight_sync",
                               hf_config_dir=args.hf_checkpoint)
        self.offload = (args.offload_rollout if args.offload_rollout is not None
                        else torch.cuda.is_available()) and self.engine is not None
        self.logger = MetricsLogger(self.log_dir, use_tensorboard=args.use_tensorboard,
                                    use_wandb=args.use_wandb, wandb_project=args.wandb_project,
                                    wandb_mode=args.wandb_mode,
                                    config=vars(args)) if _rank() == 0 else None
        self.history: list[dict] = []
        self.version = None

    def _start_backend(self):
        if _rank() != 0:
            return None, None
        if self.args.rollout_server_urls:
            return None, HTTPRollout(self.args.rollout_server_urls)
        from sglang_kvc.engine import Engine

        engine = Engine(server_args=server_args_from(self.args))
        return engine, EngineRollout(engine)

    # --- one rollout -------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], n: int, cfg: RolloutConfig) -> list:
        if _rank() != 0:
            return None
        return self.backend.generate([p.input_ids for p in prompts], n, cfg)

    def score(self, prompts: list[Prompt], gens: list, n: int) -> list[float]:
        from .rollout.rewards import RewardInput

        inputs = [RewardInput(prompt=prompts[i // n].text, response=g.text,
                              label=prompts[i // n].label, metadata=prompts[i // n].metadata)
                  for i, g in enumerate(gens)]
        return self.rewards.score(inputs)

    def rollout_step(self, rollout_id: int) -> dict:
        a, n, t = self.args, self.args.n_samples_per_prompt, {}
        prompts = self.prompts.next_batch(a.rollout_batch_size)
        start = time.perf_counter()
        payload = None
        if _rank() == 0:
            if self.offload:
                self.engine.resume_memory(["kv_cache"])
            # per-sample seeds derived from (seed, rollout id): a resumed run samples exactly
            # what an uninterrupted one would have
            cfg = dataclasses.replace(self.rollout_cfg,
                                      seed=(a.seed * 1_000_003 + rollout_id * 65_537) % 2**31)
            gens = self.generate(prompts, n, cfg)
            t["time_rollout"] = time.perf_counter() - start
            mid = time.perf_counter()
            rewards = self.score(prompts, gens, n)
            t["time_reward"] = time.perf_counter() - mid
            self._check_version(gens)
            payload = (gens, rewards, self._rollout_stats(gens, rewards))
            if self.offload:
                self.engine.release_memory(["kv_cache"])
        gens, rewards, stats = _broadcast(payload)
        samples = [Sample(prompts[i // n].input_ids, g.response_ids or [self._pad_id()])
                   for i, g in enumerate(gens)]
        rollout_logp = [torch.tensor(g.logprobs or [0.0]) for g in gens]
        batch = RolloutBatch(samples, torch.tensor(rewards, dtype=torch.float32), rollout_logp, n)

        mid = time.perf_counter()
        ref = None
        if self.reference is not None:
            ref = gather_dp(self.reference.compute_logprobs(samples), self.trainer)
        prep = prepare_update(self.trainer, batch, self.algo.advantage, self.algo.correction, ref)
        t["time_recompute"] = time.perf_counter() - mid
        mid = time.perf_counter()
        steps = run_updates(self.trainer, batch, prep, self.algo.loss, a.global_batch_size)
        t["time_update"] = time.perf_counter() - mid
        self.version = f"rollout-{rollout_id + 1}"
        sync = self.sync.push(self.trainer, self.version)
        t["time_sync"] = sync.pop("time_sync")
        train = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
        return {**stats, **prep.metrics, **{f"train/{k}": v for k, v in train.items()}, **sync,
                **t, "time_total": time.perf_counter() - start}

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0

    def _check_version(self, gens) -> None:
        if self.version is None:
            return
        stale = {g.weight_version for g in gens} - {self.version}
        if stale:
            raise RuntimeError(f"rollout used weight version(s) {sorted(map(str, stale))}, "
                               f"expected {self.version}: the weight sync did not take effect")

    def _rollout_stats(self, gens, rewards) -> dict:
        lengths = [len(g.response_ids) for g in gens]
        r = torch.tensor(rewards, dtype=torch.float64)
        stats = {"reward_mean": float(r.mean()), "reward_std": float(r.std()) if len(r) > 1 else 0.0,
                 "accuracy": float((r > 0).double().mean()),
                 "response_len_mean": sum(lengths) / len(lengths),
                 "response_len_max": float(max(lengths)),
                 "response_truncated_fraction": sum(g.finish_reason == "length" for g in gens)
                 / len(gens),
                 "aborted": float(sum(g.finish_reason == "abort" for g in gens))}
        comp = [g.meta["compression"] for g in gens if g.meta.get("compression")]
        if comp:
            mean = lambda key: sum(c.get(key, 0) for c in comp) / len(comp)  # noqa: E731
            stats["kv_compressions_per_sample"] = mean("num_compressions")
            stats["kv_tokens_evicted_per_sample"] = mean("tokens_evicted")
            stats["kv_peak_slots_per_sample"] = mean("peak_kv_slots")
            stats["kv_peak_slots_max"] = float(max(c.get("peak_kv_slots", 0) for c in comp))
        if self.engine is not None:
            pool = self.engine.get_server_info()["kv_pool"]
            stats["kv_pool_peak_used"] = float(pool["peak_used"])
            stats["kv_pool_peak_bytes"] = float(pool["peak_used"] * pool["bytes_per_slot"])
            stats["kv_pool_capacity"] = float(pool["capacity"])
        return stats

    # --- eval / save -------------------------------------------------------------------------
    def evaluate(self) -> dict:
        a = self.args
        if not a.eval_prompt_data:
            return {}
        cfg = RolloutConfig(max_response_len=a.eval_max_response_len or a.rollout_max_response_len,
                            temperature=a.eval_temperature, top_p=a.eval_top_p,
                            stop_token_ids=a.rollout_stop_token_ids,
                            concurrency=a.rollout_concurrency)
        out = {}
        for name, path in zip(a.eval_prompt_data[::2], a.eval_prompt_data[1::2]):
            if _rank() != 0:
                continue
            prompts = load_prompts(path, self.tokenizer, input_key=a.eval_input_key or a.input_key,
                                   label_key=a.eval_label_key or a.label_key,
                                   apply_chat_template=a.apply_chat_template)
            if self.offload:
                self.engine.resume_memory(["kv_cache"])
            gens = self.generate(prompts, a.n_samples_per_eval_prompt, cfg)
            if self.offload:
                self.engine.release_memory(["kv_cache"])
            scores = self.score(prompts, gens, a.n_samples_per_eval_prompt)
            out[f"eval/{name}/score"] = sum(scores) / len(scores)
            out[f"eval/{name}/response_len"] = sum(len(g.response_ids) for g in gens) / len(gens)
        return _broadcast(out)

    def save(self, rollout_id: int) -> None:
        if self.save_dir is None:
            return
        save_checkpoint(self.trainer, self.save_dir, rollout_id,
                        args=argparse.Namespace(**{k: v for k, v in vars(self.args).items()
                                                   if isinstance(v, (int, float, str, bool, list,
                                                                     type(None)))}),
                        extra={"rollout_id": rollout_id, "data": self.prompts.state()})

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self.engine is not None:
            self.engine.shutdown()
        if self.logger is not None:
            self.logger.close()


def train(args: argparse.Namespace) -> list[dict]:
    from .tracking import format_summary, plot_metrics

    run = Run(args)
    a = args
    try:
        if run.start_rollout > 0 or a.load:
            # the engine loaded --hf-checkpoint; make it serve exactly the trainer's weights
            run.version = f"rollout-{run.start_rollout}"
            run.sync.push(run.trainer, run.version)
        bar = tqdm(range(run.start_rollout, a.num_rollout), desc="rollouts",
                   disable=_rank() != 0, initial=run.start_rollout, total=a.num_rollout)
        for rollout_id in bar:
            metrics = run.rollout_step(rollout_id)
            if a.eval_interval and (rollout_id + 1) % a.eval_interval == 0:
                metrics.update(run.evaluate())
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


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ and world > 1 else None
    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=args.tensor_model_parallel_size,
                                     pp=args.pipeline_model_parallel_size, seed=args.seed)
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
