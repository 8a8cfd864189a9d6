"""Where the trainer's time goes at the recipe's shape, and the training run's update path
against ``train_step.py``'s at the same settings (one GPU, TP=1, random weights).

    python -m benchmarks.training.profile_train_step [--max-tokens-per-gpu 8192 16384] [--json out.json]
    python -m benchmarks.training.profile_train_step --shape tiny --seq-len 64 --seqs-per-step 16 \\
        --max-tokens-per-gpu 256 512 --steps 1          # a CPU smoke run, not a measurement

The samples are ``train_step.py --vary-lengths``'s (lengths uniform in [0.25, 1.75] x
``--seq-len``, seeded; ``--prompt-len`` prompt tokens), the recipe's ~1.2k-token samples with a
232-token prompt by default. For each ``--max-tokens-per-gpu``, on the same samples:

* ``bench``: ``PolicyTrainer.train_step`` with train_step.py's token-mean NLL loss (its "train");
* ``run``: one rollout's update as ``trainer/train.py`` runs it with the recipe's algorithm
  (``scripts/lib/common.sh``: GRPO, clip 0.2, low_var_kl 1e-4 to a frozen reference,
  seq_mean_token_mean, the sparse_rl correction; the whole rollout one optimizer step): the
  reference forward, π_old recomputed (the KL term with batch-normalised weights keeps the
  recompute), ``prepare_update`` and ``run_updates``; its tokens/s and MFU are the run's own
  ``perf/`` metrics (``trainer/learner/speed.py``), plus ``time_update`` as train.py times it;
* ``breakdown`` of one run update under torch.profiler: micro-batches, GPU kernel time against
  wall time (the host gap, per micro-batch), kernel families (log-probs over the vocab: the
  Triton row statistics and logits gradient; GEMMs; attention; optimizer; the rest), the
  optimizer step timed alone, the allocator's retries (a full cache frees and re-allocates:
  host syncs), and the top kernels and host ops (``--top``); the host gap again against the
  unprofiled runs' wall time (the profiler's own host work widens the profiled gap);
* ``syncs_per_rollout``: how many times the rollout's learner work (reference, π_old, update)
  makes the host wait for the GPU (CUDA's sync debug mode); the same at every budget when no
  sync is per micro-batch.

MFU and FLOPs as train_step.py counts them (``trainer/learner/speed.py``). Prints numbers,
asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import time

import torch

from benchmarks.common.report import emit
from benchmarks.training.train_step import (SHAPES, build_trainer, make_samples, nll_loss, peak_flops,
                                            sequence_lengths, sync, time_repeats)

RECIPE_ALGORITHM = ["--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.2",
                    "--kl-loss-coef", "1e-4", "--kl-loss-type", "low_var_kl", "--entropy-coef",
                    "0", "--loss-agg-mode", "seq_mean_token_mean", "--use-mis", "--mis-preset",
                    "sparse_rl"]
# kernel families by name (first match), for the device-time split
FAMILIES = (("logprobs", r"row_stats|logits_grad"),
            ("attention", r"flash|fmha|sdpa|attention|flex"),
            ("gemm", r"gemm|cutlass|cublas|matmul|sm90_xmma|nvjet"),
            ("optimizer", r"adam|multi_tensor|foreach"),
            ("gather_scatter", r"index_select|index_add|gather|scatter|indexSelect|indexFunc"),
            ("copies", r"memcpy|memset|copy_|Memcpy|Memset"))


def recipe_algorithm():
    from trainer.algorithms.argparse_flags import add_algorithm_args, config_from_args

    return config_from_args(add_algorithm_args(argparse.ArgumentParser()).parse_args(
        RECIPE_ALGORITHM))


def build_reference(trainer):
    """A frozen reference policy of the same shape (random weights), for the KL term."""
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer

    return PolicyTrainer(trainer.model_cfg, OptimConfig(), trainer.train_cfg, load_weights=False,
                         trainable=False)


def rollout_batch(trainer, samples, group: int = 8):
    """A rollout of the samples: π_sparse = π_current + noise (the correction has work), 0/1
    rewards in groups of ``group``."""
    from trainer.learner.grpo_update import RolloutBatch

    g = torch.Generator().manual_seed(1)
    current = trainer.compute_logprobs(samples)
    rollout = [lp + 0.05 * torch.randn(lp.shape, generator=g) for lp in current]
    rewards = (torch.rand(len(samples), generator=g) < 0.5).float()
    return RolloutBatch(samples, rewards, rollout, n_samples_per_prompt=group)


def run_update(trainer, reference, batch, algo, peak: float | None) -> dict:
    """One rollout's learner work as ``trainer.train.Run.rollout_step`` does it; its seconds
    and the trainer's own ``perf/`` metrics."""
    from trainer.learner.fused_old_logp import plan_old_logp
    from trainer.learner.grpo_update import gather_dp, prepare_update, run_updates
    from trainer.learner.replay_cache import shared_replay_masks
    from trainer.learner.speed import rollout_speed

    n = len(batch.samples)
    rollout_speed((trainer, reference))  # drop what earlier calls (bench steps) recorded
    with shared_replay_masks():
        start = time.perf_counter()
        ref = gather_dp(reference.compute_logprobs(batch.samples), trainer)
        plan = plan_old_logp(trainer.train_cfg, batch, algo, n)
        prep = prepare_update(trainer, batch, algo.advantage, algo.correction, ref, plan)
        recompute = time.perf_counter() - start
        run_updates(trainer, batch, prep, algo.loss, n)
        update = time.perf_counter() - recompute - start
    return dict(time_recompute=recompute, time_update=update, fused=plan.fused,
                **rollout_speed((trainer, reference), peak=peak))


def median_metrics(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]
            if isinstance(runs[0][k], float)}


def kernel_families(events) -> dict:
    """Device ms per kernel family (``FAMILIES``; unmatched: ``other``)."""
    out = {name: 0.0 for name, _ in FAMILIES} | {"other": 0.0}
    for e in events:
        ms = e.self_device_time_total / 1e3
        if ms <= 0:
            continue
        family = next((n for n, pat in FAMILIES if re.search(pat, e.key, re.I)), "other")
        out[family] += ms
    return {k: round(v, 2) for k, v in out.items()}


@contextlib.contextmanager
def timed_optimizer(trainer):
    """The optimizer's steps timed (synchronised): their seconds go in the yielded list."""
    seconds, step = [], trainer.optimizer.step

    def timed():
        sync()
        start = time.perf_counter()
        out = step()
        sync()
        seconds.append(time.perf_counter() - start)
        return out

    trainer.optimizer.step = timed
    try:
        yield seconds
    finally:
        trainer.optimizer.step = step


def breakdown(trainer, reference, batch, algo, top: int, peak: float | None) -> dict:
    """One run update under torch.profiler: where its device and host time go."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    micro = len(trainer._micro_batches(batch.samples, trainer.local_sample_ids(len(batch.samples))))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with timed_optimizer(trainer) as optimizer_s, profile(activities=activities) as prof:
        m = run_update(trainer, reference, batch, algo, peak)
    events = prof.key_averages()
    for key in (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]:
        print(f"--- one run update, top by {key} ---")
        print(events.table(sort_by=key, row_limit=top, max_name_column_width=80))
    wall_ms = 1e3 * (m["time_recompute"] + m["time_update"])
    out = dict(micro_batches_per_pass=micro, wall_ms_profiled=round(wall_ms, 1),
               optimizer_ms=round(1e3 * sum(optimizer_s), 1))
    if cuda:
        families = kernel_families(events)
        busy = sum(families.values())
        gap = wall_ms - busy
        # three passes over the micro-batches: reference, π_old, update
        stats = torch.cuda.memory_stats()
        out.update(gpu_kernel_ms=round(busy, 1), gpu_busy=round(busy / wall_ms, 3),
                   alloc_retries=stats.get("num_alloc_retries", 0),
                   cuda_mallocs=stats.get("segment.all.allocated", 0),
                   host_gap_ms=round(gap, 1),
                   host_gap_ms_per_micro_batch=round(gap / max(1, 3 * micro), 2),
                   kernel_ms=families)
    return out


def profile_budget(trainer, reference, samples, args, algo, budget: int,
                   peak: float | None) -> dict:
    from benchmarks.training.train_step import Timing, train_flops

    trainer.train_cfg.max_tokens_per_gpu = budget  # the reference shares this config
    tokens = sum(s.length for s in samples)
    flops = train_flops(trainer.arch, [s.length for s in samples])
    loss_fn = nll_loss(samples)
    bench_step = lambda: trainer.train_step(samples, loss_fn)  # noqa: E731
    batch = rollout_batch(trainer, samples)
    for _ in range(args.warmup):
        bench_step()
        run_update(trainer, reference, batch, algo, peak)
    bench = Timing(time_repeats(bench_step, args.steps, 1), tokens, flops).summary(peak)
    runs = [run_update(trainer, reference, batch, algo, peak) for _ in range(args.steps)]
    run = median_metrics(runs)
    run["time_update_tokens_per_s"] = tokens / run["time_update"]
    out = dict(max_tokens_per_gpu=budget, bench=bench, run=run,
               run_vs_bench=round(run["perf/update_tokens_per_s"]
                                  / bench["tokens_per_s"]["median"], 3))
    if not args.no_profile:
        out["breakdown"] = breakdown(trainer, reference, batch, algo, args.top, peak)
        _unprofiled_gap(out["breakdown"], run)
    if torch.cuda.is_available():
        out["syncs_per_rollout"] = count_syncs(lambda: run_update(trainer, reference, batch,
                                                                  algo, peak))
    return out


def _unprofiled_gap(b: dict, run: dict) -> None:
    """The host gap again with the wall time of the unprofiled runs (the profiler's own host
    overhead widens the profiled one): their seconds less the profiled kernel time."""
    if "gpu_kernel_ms" in b:
        wall = 1e3 * (run["time_recompute"] + run["time_update"])
        b["host_gap_ms_per_micro_batch_unprofiled"] = round(
            (wall - b["gpu_kernel_ms"]) / (3 * b["micro_batches_per_pass"]), 2)
        b["gpu_busy_unprofiled"] = round(b["gpu_kernel_ms"] / wall, 3)


def count_syncs(step) -> int:
    """Times ``step`` makes the host wait for the GPU (``torch.cuda.set_sync_debug_mode``: one
    warning per synchronising call, each pass's two ``synchronize`` of ``speed.timed`` and
    Megatron's gradient clipping included); the same at any number of micro-batches."""
    import warnings

    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument("--seq-len", type=int, default=1200, help="mean sample length")
    p.add_argument("--prompt-len", type=int, default=232)
    p.add_argument("--response-cap", type=int, default=None,
                   help="cut responses at this many tokens (the run's --rollout-max-response-len:"
                        " random weights mostly reach it, so the run's samples are ~prompt + cap)")
    p.add_argument("--seqs-per-step", type=int, default=256, help="samples per rollout (32 x 8)")
    p.add_argument("--max-tokens-per-gpu", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "local", "te", "auto"])
    p.add_argument("--log-probs-chunk-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2, help="measured rollouts / train steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--top", type=int, default=25, help="rows of the top-kernel table")
    p.add_argument("--no-profile", action="store_true", help="timings only, no torch.profiler")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.vary_lengths = True
    return args


def main(argv=None) -> dict:
    from checkpoint_tools import cpu_megatron

    args = parse_args(argv)
    args_first = argparse.Namespace(**{**vars(args), "max_tokens_per_gpu": args.max_tokens_per_gpu[0]})
    trainer = build_trainer(args_first)
    reference = build_reference(trainer)
    peak = peak_flops(args.peak_tflops)
    lengths = sequence_lengths(args)
    if args.response_cap:
        lengths = [min(n, args.prompt_len + args.response_cap) for n in lengths]
    samples = make_samples(trainer.arch.vocab_size, lengths, args.prompt_len, args.seed)
    algo = recipe_algorithm()
    result = dict(shape=args.shape, samples=len(samples),
                  tokens_per_step=sum(s.length for s in samples), prompt_len=args.prompt_len,
                  seq_len=args.seq_len, response_cap=args.response_cap, budgets=[])
    for budget in args.max_tokens_per_gpu:
        r = profile_budget(trainer, reference, samples, args, algo, budget, peak)
        print_budget(r)
        result["budgets"].append(r)
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    cpu_megatron.teardown()
    return emit(result, args.json)


def print_budget(r: dict) -> None:
    b, run = r["bench"], r["run"]
    mfu = lambda x: f"{x:.1%}" if x is not None else "-"  # noqa: E731
    print(f"--- max tokens per GPU {r['max_tokens_per_gpu']} ---")
    print(f"bench train step: {b['tokens_per_s']['median']:,.0f} tokens/s, MFU "
          f"{mfu(b.get('mfu', {}).get('median'))}")
    for phase in ("reference", "old_logp", "update"):
        if f"perf/{phase}_tokens_per_s" in run:
            print(f"run {phase:9s}: {run[f'perf/{phase}_tokens_per_s']:,.0f} tokens/s, MFU "
                  f"{mfu(run.get(f'perf/{phase}_mfu'))}")
    print(f"run update / bench train step: {r['run_vs_bench']:.3f}; time_update "
          f"{run['time_update']:.2f} s ({run['time_update_tokens_per_s']:,.0f} tokens/s)")
    if "breakdown" in r:
        print("breakdown:", r["breakdown"])
    if "syncs_per_rollout" in r:
        print(f"host syncs per rollout (reference, π_old, update): {r['syncs_per_rollout']}")


if __name__ == "__main__":
    main()
