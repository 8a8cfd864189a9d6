"""One full RL step of the real training loop, phase by phase: rollout (in-process sglang-kvc
engine), reward, π_old recompute, policy update, weight sync.

    python -m benchmarks.training.rl_step [--shape qwen2.5-0.5b | --hf-checkpoint DIR] \\
        [--prompts 32] [--samples 8] [--response-len 512] [--compress rkv] [--steps 3] \\
        [--profile DIR] [--json PATH] [any trainer.train flag]

It drives ``trainer.train.Run`` (flags parsed by ``trainer.arguments``, so anything the trainer
takes may follow) on generated arithmetic prompts, with a random checkpoint of ``--shape`` built
in a temp dir unless ``--hf-checkpoint`` is given. One warm-up step, then ``--steps`` measured
steps: min / median / max of each phase's seconds, tokens/s and efficiency (``summary``), and the
same over the timed steps after the first (``steady``: the steady state, when there are two or
more). ``--json`` is rewritten after every timed step, so a run cut short keeps the steps it made
(``"partial": true`` until the last).

One step off-policy (``--max-staleness 1`` on engines that generate beside training) generates
rollout n+1 while step n trains; the run generates one rollout more than it trains, so the last
timed step overlaps a generation as every step of a long run does (else it would train alone and
look faster than the steady state).

* recompute MFU: forward FLOPs (a third of ``train_step.flops_per_token``) of every sequence
  the policy (and reference) recomputed, over the phase's seconds and the dense bf16 peak of
  every learner GPU (``learner_gpus``: the trainer's ranks, which share the batch): per GPU;
* update MFU: forward + backward FLOPs (``flops_per_token``) of every trained sequence, the same
  way;
* rollout, fraction of the HBM roofline: bytes a decode must read at least, over HBM peak
  (H100 3.35e12 B/s, H200 4.8e12), divided by the rollout seconds, with
  bytes = S x W + sum_i sum_{j < r_i} min(p_i + j, C) x K, where
  W = bytes of the weights each decode step reads (all layers and the lm head),
  S = max(max_i r_i, ceil(sum_i r_i / R)) decode steps (R: --sglang-max-running-requests),
  K = KV bytes per token (2 x layers x KV heads x head_dim x dtype bytes),
  p_i / r_i = prompt / response tokens of sample i, C = infinity dense, or B + N / 2 when
  compressed (budget B, re-compressed every N tokens). Prefill and sampling are not counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.report import emit, spread
from benchmarks.training.train_step import device_name, flops_per_token, peak_flops

HBM_PEAK = {"H100": 3.35e12, "H200": 4.8e12}
PHASES = ("rollout", "reward", "recompute", "update", "sync", "total")


def write_prompts(path: Path, n: int, seed: int) -> Path:
    from trainer.quickstart import make_rows

    path.write_text("".join(json.dumps(r) + "\n" for r in make_rows(n, seed)))
    return path


def compress_flags(args) -> list[str]:
    if args.compress == "none":
        return []
    return ["--sglang-compress-algorithm", args.compress,
            "--sglang-compress-max-prompt", str(args.kv_budget),
            "--sglang-compress-divide-length", str(args.compress_divide_length),
            "--sglang-compress-max-window", "8", "--sglang-compress-divide-method", "step_length"]


def trainer_argv(args, hf: Path, data: Path, work: Path, rollouts: int) -> list[str]:
    n = args.prompts * args.samples
    if n % args.optimizer_steps:
        raise SystemExit(f"--optimizer-steps {args.optimizer_steps} must divide {n} samples")
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(data),
            "--log-dir", str(work / "logs"), "--num-rollout", str(rollouts),
            "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
            "--global-batch-size", str(n // args.optimizer_steps),
            "--rollout-max-response-len", str(args.response_len), "--rollout-temperature", "1.0",
            "--lr", "1e-6", "--kl-loss-coef", "0", "--rm-type", "math",
            *max_tokens_flag(args), "--seed", str(args.seed),
            "--sglang-max-running-requests", str(n),
            "--sglang-max-total-tokens", str(n * (args.response_len + 128) + 4096),
            *compress_flags(args)]


def max_tokens_flag(args) -> list[str]:
    """0: the trainer's memory-sized default (token_budget.py), as the run scripts leave it."""
    return ["--max-tokens-per-gpu", str(args.max_tokens_per_gpu)] if args.max_tokens_per_gpu else []


@dataclasses.dataclass
class Recorder:
    """The sequences each learner phase processed in the current step (wrapped methods)."""

    recompute: list = dataclasses.field(default_factory=list)
    update: list = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        self.recompute, self.update = [], []

    def attach(self, run) -> None:
        for trainer in (run.learner.policy, run.learner.reference):
            if trainer is not None:
                trainer.compute_logprobs = self._wrap(trainer.compute_logprobs, "recompute")
        run.learner.policy.train_step = self._wrap(run.learner.policy.train_step, "update")

    def _wrap(self, method, phase: str):
        def call(samples, *a, **kw):
            getattr(self, phase).extend(samples)
            return method(samples, *a, **kw)

        return call


@dataclasses.dataclass
class Machine:
    """What the efficiency numbers are measured against."""

    name: str
    peak_flops: float | None  # one GPU's
    peak_hbm: float | None
    learner_gpus: int = 1  # the trainer's ranks: the GPUs the recompute and the update run on

    @classmethod
    def detect(cls, args) -> "Machine":
        name = device_name()
        hbm = args.peak_hbm_gbps * 1e9 if args.peak_hbm_gbps else next(
            (v for k, v in HBM_PEAK.items() if k in name), None)
        return cls(name, peak_flops(args.peak_tflops), hbm, _world_size())

    def mfu(self, flops: float, seconds: float) -> float:
        """Per learner GPU: ``flops`` are the whole batch's (every rank's share), so they are
        set against the peak of all the ranks that shared them."""
        return flops / seconds / (self.peak_flops * self.learner_gpus)


@dataclasses.dataclass
class DecodeModel:
    """Bytes a decode step reads (see the module docstring)."""

    weight_bytes: float  # W
    kv_bytes_per_token: float  # K
    max_running: int  # R
    kv_cap: float  # C

    @classmethod
    def from_run(cls, arch, args) -> "DecodeModel":
        w = _dtype_bytes(args.sglang_dtype, arch.dtype)
        kv = _dtype_bytes(args.sglang_kv_cache_dtype, arch.dtype) if args.sglang_kv_cache_dtype != "auto" else w
        d, f, hd, L = arch.hidden_size, arch.ffn_hidden_size, arch.head_dim, arch.num_layers
        nh, ng = arch.num_attention_heads, arch.num_query_groups
        per_layer = d * (nh + 2 * ng) * hd + nh * hd * d + 3 * d * f
        cap = (args.sglang_compress_max_prompt + args.sglang_compress_divide_length / 2
               if args.sglang_compress_algorithm else math.inf)
        return cls((L * per_layer + arch.vocab_size * d) * w, 2 * L * ng * hd * kv,
                   args.sglang_max_running_requests, cap)

    def bytes(self, prompt_lens: list[int], response_lens: list[int]) -> float:
        steps = max(max(response_lens), math.ceil(sum(response_lens) / self.max_running))
        kv_tokens = sum(float((torch.arange(r, dtype=torch.float64) + p).clamp(max=self.kv_cap).sum())
                        for p, r in zip(prompt_lens, response_lens))
        return steps * self.weight_bytes + kv_tokens * self.kv_bytes_per_token


def _dtype_bytes(name: str | None, default: torch.dtype) -> int:
    if name and name.startswith("fp8"):  # --sglang-kv-cache-dtype fp8_e4m3 / fp8_e5m2
        return 1
    dtype = default if name in (None, "auto") else getattr(torch, name)
    return torch.empty((), dtype=dtype).element_size()


def step_numbers(m: dict, rec: Recorder, arch, decode: DecodeModel, machine: Machine) -> dict:
    """Seconds, tokens/s and efficiency of each phase of one step."""
    fwd = sum(s.length * flops_per_token(arch, s.length) / 3 for s in rec.recompute)
    train = sum(s.length * flops_per_token(arch, s.length) for s in rec.update)
    out = {f"{p}_s": m[f"time_{p}"] for p in PHASES}
    responses = [len(s.response_ids) for s in rec.update]
    out.update(rollout_tokens=sum(responses), rollout_tokens_per_s=m["rollout_tokens_per_s"],
               recompute_tokens_per_s=sum(s.length for s in rec.recompute) / m["time_recompute"],
               update_tokens_per_s=sum(s.length for s in rec.update) / m["time_update"],
               sync_gb_per_s=m.get("sync_bytes", 0.0) / 1e9 / max(m["time_sync"], 1e-9),
               response_len_mean=m["response_len_mean"], reward_mean=m["reward_mean"],
               aborted=m["aborted"])
    out.update({k: m[k] for k in ("kv_compressions_per_sample", "kv_peak_slots_per_sample",
                                  "kv_pool_peak_used", "kv_pool_peak_bytes", "kv_pool_capacity",
                                  "rollout_preemptions", "rollout_tail_fraction",
                                  "memory/peak_allocated_gib", "memory/peak_reserved_gib") if k in m})
    # the weight push by phase (WeightSync: export, flatten / serialize, group, transfer, ...)
    out.update({k: v for k, v in m.items() if k.startswith("sync_") and k.endswith("_s")})
    if machine.peak_flops:
        out["recompute_mfu"] = machine.mfu(fwd, m["time_recompute"])
        out["update_mfu"] = machine.mfu(train, m["time_update"])
    if machine.peak_hbm and m["time_rollout"] > 0:  # async: 0 when the rollout was ready
        floor = decode.bytes([len(s.prompt_ids) for s in rec.update], responses) / machine.peak_hbm
        out["rollout_hbm_roofline_fraction"] = floor / m["time_rollout"]
    return out


def profile_step(run, rollout_id: int, out_dir: Path) -> Path:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run.rollout_step(rollout_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "rl_step_trace.json"
    prof.export_chrome_trace(str(path))
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=80))
    return path


def summarize(steps: list[dict]) -> dict:
    keys = [k for k in steps[0] if all(k in s for s in steps)]
    return {k: spread([s[k] for s in steps]) for k in keys}


def steady_summary(steps: list[dict]) -> dict:
    """``summarize`` over the timed steps after the first (all of them when there is one): the
    first may still pay for what the warm-up did not reach (allocator growth, a first overlap)."""
    return summarize(steps[1:] if len(steps) > 1 else steps)


def generate_ahead(cfg):
    """``cfg`` with one rollout more than the loop trains when the run generates ahead
    (``--max-staleness`` >= 1 on engines that keep their memory through training: the loop's own
    ``memory_safe`` rule), so that every timed step overlaps the next rollout's generation."""
    asynchrony, engines = cfg.rollout.asynchrony, cfg.rollout.engines
    if not asynchrony.max_staleness or not engines.generates_beside_training():
        return cfg
    loop = dataclasses.replace(cfg.loop, num_rollout=cfg.loop.num_rollout + 1)
    return dataclasses.replace(cfg, loop=loop)


def print_table(summary: dict, n: int) -> None:
    print(f"{'(over ' + str(n) + ' step(s))':32s} {'min':>12s} {'median':>12s} {'max':>12s}")
    for k, v in summary.items():
        print(f"{k:32s} {v['min']:12.4g} {v['median']:12.4g} {v['max']:12.4g}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-checkpoint", default=None, help="default: a random --shape checkpoint")
    p.add_argument("--shape", default="qwen2.5-0.5b",
                   choices=["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "smollm2-135m"],
                   help="random checkpoint's shape (tiny: a CPU smoke run, not a measurement)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--response-len", type=int, default=512, help="most response tokens")
    p.add_argument("--optimizer-steps", type=int, default=1, help="optimizer steps per RL step")
    p.add_argument("--max-tokens-per-gpu", type=int, default=8192,
                   help="0: sized from free memory (the trainer's default)")
    p.add_argument("--compress", default="none", choices=["none", "rkv", "snapkv", "streamingllm"])
    p.add_argument("--kv-budget", type=int, default=128, help="--sglang-compress-max-prompt")
    p.add_argument("--compress-divide-length", type=int, default=64)
    p.add_argument("--packed-attention", default="auto", choices=["auto", "varlen", "loop", "mask"],
                   help="how the learner attends packed micro-batches (loop: the old per-sequence path)")
    p.add_argument("--steps", type=int, default=3, help="measured steps, after one warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (MFU)")
    p.add_argument("--peak-hbm-gbps", type=float, default=None, help="HBM peak (roofline)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also profile one more step; chrome trace in DIR")
    p.add_argument("--workdir", default=None, help="default: a temp dir")
    p.add_argument("--json", default=None, help="write the result here too")
    return p.parse_known_args(argv)


def start_run(args, extra: list[str], work: Path):
    from trainer.arguments import parse_args as trainer_args
    from trainer.learner.attention import set_packed_attention
    from trainer.launch import init_parallel, parallel_config_from_args
    from trainer.train import Run, run_config_from_args

    set_packed_attention(args.packed_attention)
    hf = Path(args.hf_checkpoint) if args.hf_checkpoint else build_checkpoint(args.shape, work / "hf")
    data = write_prompts(work / "prompts.jsonl", args.prompts * (args.steps + 2) * 4, args.seed)
    rollouts = 1 + args.steps + bool(args.profile)
    targs = trainer_args(trainer_argv(args, hf, data, work, rollouts) + extra)
    init_parallel(parallel_config_from_args(targs))
    # --rollout-engine-process: the engine as a child process (the run's rollout side)
    return targs, Run(generate_ahead(run_config_from_args(targs)))


def write_partial(args, steps: list[dict]) -> None:
    """The timed steps so far in ``--json`` (rank 0): what is left if the run is cut."""
    if args.json and _rank() == 0:
        Path(args.json).write_text(json.dumps(
            {"partial": True, "steps": steps, "summary": summarize(steps),
             "steady": steady_summary(steps)}, indent=2))


def measure(args, targs, run) -> tuple[list[dict], Path | None]:
    from checkpoint_tools.model_config import load_arch

    rec, machine = Recorder(), Machine.detect(args)
    rec.attach(run)
    arch = load_arch(targs.hf_checkpoint)
    decode = DecodeModel.from_run(arch, targs)
    steps = []
    for i in range(1 + args.steps):
        rec.clear()
        started = time.time()
        metrics = run.rollout_step(i)
        if _rank() == 0:
            print(f"[bench-rl-step] step {i}{' (warm-up)' if not i else ''}: "
                  f"{metrics['time_total']:.2f} s, ended {_clock()}", flush=True)
        if i:  # step 0 warms up (compilation, CUDA graphs, allocator)
            steps.append({**step_numbers(metrics, rec, arch, decode, machine),
                          "started_at": started, "ended_at": time.time()})
            write_partial(args, steps)
    trace = profile_step(run, 1 + args.steps, Path(args.profile)) if args.profile else None
    return steps, trace


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def _clock() -> str:
    """Wall-clock time to the millisecond (to line steps up with e.g. nvidia-smi samples)."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def main(argv=None) -> dict:
    from checkpoint_tools import cpu_megatron

    args, extra = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-rl-step-"))
    work.mkdir(parents=True, exist_ok=True)
    targs, run = start_run(args, extra, work)
    try:
        steps, trace = measure(args, targs, run)
        rank, machine = _rank(), Machine.detect(args)  # the ranks: before the teardown
        max_tokens = run.learner.policy.train_cfg.max_tokens_per_gpu  # as given or as sized
    finally:
        run.close()  # its engine processes too
        cpu_megatron.teardown()
    if rank != 0:  # torchrun: rank 0 reports for the job
        return {}
    summary = summarize(steps)
    print_table(summary, len(steps))
    result = dict(gpu=machine.name, shape=None if args.hf_checkpoint else args.shape,
                  hf_checkpoint=targs.hf_checkpoint, prompts=args.prompts, samples=args.samples,
                  response_len=args.response_len, compress=args.compress,
                  max_tokens_per_gpu=max_tokens, packed_attention=args.packed_attention,
                  peak_flops=machine.peak_flops, learner_gpus=machine.learner_gpus,
                  peak_hbm_bytes_per_s=machine.peak_hbm,
                  steps=steps, summary=summary, steady=steady_summary(steps),
                  profile_trace=str(trace) if trace else None)
    return emit(result, args.json)


if __name__ == "__main__":
    main()
