"""Throughput and MFU of the Megatron policy (one GPU, TP=1): forward only (the π_old
recompute) and forward + backward (a train step), on the Qwen2.5-0.5B or SmolLM2-135M shape.

    python -m benchmarks.training.train_step [--seq-len 4096] [--seqs-per-step 16] [--attention sdpa]
    python -m benchmarks.training.train_step --shape smollm2-135m --seq-len 800 --vary-lengths \\
        --seqs-per-step 64 --max-tokens-per-gpu 8192 --repeats 3

Random weights (no hub). A train step is a full ``PolicyTrainer.train_step`` (packed
micro-batches of ``--max-tokens-per-gpu`` tokens, chunked vocab-parallel log-probs, backward,
Adam) with a token-mean NLL loss over the response tokens; the forward pass is
``PolicyTrainer.compute_logprobs`` on the same samples. ``--vary-lengths`` draws each sequence's
length uniformly from [0.25, 1.75] x ``--seq-len`` (seeded): RL-shaped batches of many short
sequences. MFU counts the matmul FLOPs of the model (6 x params x tokens, lm head included)
plus causal attention (6 x layers x S x heads x head_dim per token of a length-S sequence),
a third of that for the forward pass, against the GPU's dense bf16 peak: the count a training
run's ``perf/`` metrics use (``trainer/learner/speed.py``). ``--repeats``
measures ``--steps`` steps that many times and prints min / median / max.

``--grpo-step`` also times one rollout's whole GRPO update as ``trainer/train.py`` runs it
(advantages, sparse_rl correction, no KL, one optimizer step) two ways: π_old recomputed by a
forward pass first, and π_old taken from the update's own forward (``fused_old_logp.py``).

    python -m benchmarks.training.train_step --shape tiny --seq-len 64 --seqs-per-step 32 \
        --max-tokens-per-gpu 512 --grpo-step --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.report import emit, spread

# one FLOP count and one peak table for the benchmarks and the training run's perf/ metrics
from trainer.learner.speed import device_name, flops_per_token, peak_for, train_flops  # noqa: F401

QWEN25_05B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896,
                  intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-6, dtype="bfloat16")
SMOLLM2_135M = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576,
                    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                    rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                    attention_bias=False, mlp_bias=False, dtype="bfloat16")
# a few-second CPU run of every code path (tests, smoke checks); not a measurement
TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=4096)
SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "smollm2-135m": SMOLLM2_135M, "tiny": TINY}


def peak_flops(override_tflops: float | None = None) -> float | None:
    """Dense bf16 peak of this GPU (``--peak-tflops`` wins); None where unknown (a CPU, a GPU
    missing from ``trainer/learner/speed.py``'s table): MFU is then left out."""
    if override_tflops:
        return override_tflops * 1e12
    return peak_for(device_name()) if torch.cuda.is_available() else None


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclasses.dataclass
class Timing:
    """Seconds per step of each repeat, and what one step does."""

    seconds: list[float]
    tokens: int
    flops: float

    def summary(self, peak: float | None) -> dict:
        out = {"step_s": spread(self.seconds),
               "tokens_per_s": spread([self.tokens / s for s in self.seconds], 6)}
        if peak:
            out["mfu"] = spread([self.flops / s / peak for s in self.seconds])
        return out


def time_repeats(step, steps: int, repeats: int) -> list[float]:
    """Mean seconds per call of ``step`` over ``steps`` calls, ``repeats`` times."""
    out = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        out.append((time.perf_counter() - start) / steps)
    return out


def sequence_lengths(args) -> list[int]:
    if not args.vary_lengths:
        return [args.seq_len] * args.seqs_per_step
    rng = random.Random(args.seed)
    lo, hi = max(2, round(0.25 * args.seq_len)), max(2, round(1.75 * args.seq_len))
    return [rng.randint(lo, hi) for _ in range(args.seqs_per_step)]


def make_samples(vocab: int, lengths: list[int], prompt_len: int, seed: int):
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(seed)
    tokens = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    prompts = [min(prompt_len, n - 1) for n in lengths]
    return [Sample(tokens(p), tokens(n - p)) for n, p in zip(lengths, prompts)]


def build_trainer(args):
    from checkpoint_tools import cpu_megatron
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig

    cfg_dir = Path(tempfile.mkdtemp(prefix="bench-train-"))
    (cfg_dir / "config.json").write_text(json.dumps(SHAPES[args.shape]))
    cpu_megatron.init_distributed(0, 1)
    cpu_megatron.init_model_parallel(1, 1)
    return PolicyTrainer(ModelConfig(hf_checkpoint=str(cfg_dir), attention_backend=args.attention),
                         OptimConfig(lr=1e-6),
                         TrainConfig(max_tokens_per_gpu=args.max_tokens_per_gpu,
                                     log_probs_chunk_size=args.log_probs_chunk_size),
                         load_weights=False)


def nll_loss(samples):
    n_resp = sum(len(s.response_ids) for s in samples)

    def loss_fn(logp, ent, ids):
        loss = sum(-lp.sum() for lp in logp) / n_resp
        return loss, {"loss": loss.detach()}

    return loss_fn


def grpo_updates(trainer, samples) -> dict:
    """``{"recompute": step, "fused": step}``: one rollout's update either way (sparse_rl
    correction against a stand-in π_sparse = π_old + noise, no KL: the fused path applies)."""
    from trainer.algorithms import AdvantageConfig, PolicyLossConfig, correction_preset
    from trainer.learner.fused_old_logp import OldLogpPlan
    from trainer.learner.grpo_update import RolloutBatch, prepare_update, run_updates

    g = torch.Generator().manual_seed(1)
    current = trainer.compute_logprobs(samples)
    rollout = [lp + 0.1 * torch.randn(lp.shape, generator=g) for lp in current]
    batch = RolloutBatch(samples, torch.rand(len(samples), generator=g), rollout,
                         group_index=[i // 4 for i in range(len(samples))])
    adv, corr = AdvantageConfig(estimator="grpo"), correction_preset("sparse_rl")
    loss = PolicyLossConfig(kl_loss_coef=0.0)

    def step(fused: bool):
        plan = OldLogpPlan(fused, "bench")
        prep = prepare_update(trainer, batch, adv, corr, None, plan)
        return run_updates(trainer, batch, prep, loss, len(samples))

    return {"recompute": lambda: step(False), "fused": lambda: step(True)}


def time_grpo_updates(trainer, samples, args, flops: float) -> dict:
    steps = grpo_updates(trainer, samples)
    for step in steps.values():
        step()  # warm-up
    tokens = sum(s.length for s in samples)
    extra = {"recompute": flops * 4 / 3, "fused": flops}  # the recompute: one forward more
    return {f"grpo_{k}": Timing(time_repeats(step, args.steps, args.repeats), tokens, extra[k])
            for k, step in steps.items()}


def profile_step(step, elapsed: float) -> None:
    """The top kernels of one step, and how busy the device was."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        sync()
    events = prof.key_averages()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=40, max_name_column_width=90))
    if cuda:
        busy = sum(e.self_device_time_total for e in events) / 1e3
        print(f"GPU kernel time {busy:.0f} ms in a {elapsed * 1e3:.0f} ms step "
              f"({busy / (elapsed * 1e3):.0%} busy)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES),
                   help="model shape (tiny: a CPU smoke run, not a measurement)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--vary-lengths", action="store_true",
                   help="lengths uniform in [0.25, 1.75] x --seq-len (seeded), as RL batches")
    p.add_argument("--prompt-len", type=int, default=256, help="at most; the rest is response")
    p.add_argument("--seqs-per-step", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "local", "te", "auto"])
    p.add_argument("--packed-attention", default="auto", choices=["auto", "varlen", "loop", "mask"],
                   help="how sdpa attends packed micro-batches (loop: one SDPA per sequence, "
                        "the behaviour before the varlen kernel)")
    p.add_argument("--log-probs-chunk-size", type=int, default=1024,
                   help="tokens per chunk of the fp32 log-prob pass")
    p.add_argument("--steps", type=int, default=5, help="steps per repeat")
    p.add_argument("--repeats", type=int, default=1, help="measure this many times: min/median/max")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for MFU (default: from the GPU's name; none on a CPU)")
    p.add_argument("--json", default=None, help="write the result here too")
    p.add_argument("--profile", action="store_true", help="print the top CUDA kernels of a step")
    p.add_argument("--grpo-step", action="store_true",
                   help="also time a GRPO update with π_old recomputed vs fused into the update")
    return p.parse_args(argv)


def print_table(result: dict) -> None:
    for phase in ("forward", "train", "grpo_recompute", "grpo_fused"):
        if phase not in result:
            continue
        r = result[phase]
        cols = [f"{k} {v['min']:g} / {v['median']:g} / {v['max']:g}" for k, v in r.items()]
        print(f"{phase:14s} (min / median / max over {result['repeats']} repeat(s)): "
              + "; ".join(cols))
    if "grpo_fused" in result:
        old, new = (result[k]["step_s"]["median"] for k in ("grpo_recompute", "grpo_fused"))
        print(f"GRPO update per rollout (median): recompute then update {old:g} s, fused "
              f"{new:g} s ({old / new:.2f}x)")


def run(args) -> dict:
    from checkpoint_tools import cpu_megatron
    from trainer.learner.attention import set_packed_attention
    from trainer.learner.packing import split_by_token_budget

    set_packed_attention(args.packed_attention)
    trainer = build_trainer(args)
    arch = trainer.arch
    lengths = sequence_lengths(args)
    samples = make_samples(arch.vocab_size, lengths, args.prompt_len, args.seed)
    loss_fn, last = nll_loss(samples), {}
    train = lambda: last.update(trainer.train_step(samples, loss_fn))  # noqa: E731
    forward = lambda: trainer.compute_logprobs(samples)  # noqa: E731
    for _ in range(args.warmup):
        train()
    forward()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    flops = train_flops(arch, lengths)
    timings = {"forward": Timing(time_repeats(forward, args.steps, args.repeats), sum(lengths),
                                 flops / 3),
               "train": Timing(time_repeats(train, args.steps, args.repeats), sum(lengths), flops)}
    if args.grpo_step:
        timings.update(time_grpo_updates(trainer, samples, args, flops))
    if args.profile:
        profile_step(train, statistics.median(timings["train"].seconds))
    peak = peak_flops(args.peak_tflops)
    result = dict(gpu=device_name(), shape=args.shape, seq_len=args.seq_len,
                  vary_lengths=args.vary_lengths, seqs_per_step=args.seqs_per_step,
                  tokens_per_step=sum(lengths), max_tokens_per_gpu=args.max_tokens_per_gpu,
                  micro_batches=len(split_by_token_budget(lengths, args.max_tokens_per_gpu)),
                  attention=args.attention, packed_attention=args.packed_attention,
                  repeats=args.repeats, steps=args.steps,
                  **{k: t.summary(peak) for k, t in timings.items()})
    train_summary = result["train"]
    result.update(step_s=train_summary["step_s"]["median"],
                  tokens_per_s=train_summary["tokens_per_s"]["median"],
                  mfu=train_summary.get("mfu", {}).get("median"),
                  loss=float(last["loss"]))
    if torch.cuda.is_available():
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    cpu_megatron.teardown()
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    return emit(result, args.json)


if __name__ == "__main__":
    main()
