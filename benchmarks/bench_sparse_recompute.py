"""Eviction replay's cost: π_old recompute and train-step tokens/s with the sampler's eviction
masks (``--sparse-recompute`` / ``--train-sparse-policy``) against the dense packed attention
(varlen on CUDA), on RL-shaped packed batches, plus the time to build one micro-batch's masks.

    python benchmarks/bench_sparse_recompute.py                       # 0.5B shape, GPU
    python benchmarks/bench_sparse_recompute.py --shape tiny --response-len 300 --budget 64 \\
        --divide-length 16 --seqs-per-step 4 --max-tokens-per-gpu 1024 --steps 1   # CPU smoke

Random weights. Records are R-KV-shaped: every ``--divide-length`` steps past ``--budget``
held tokens, each layer and KV head keeps the window plus a random ``budget - window`` of the
rest (scattered kept sets: the costly case for tiled kernels). Responses have
``--response-len`` tokens (``--vary-lengths``: uniform in [0.5, 1] x that). Prints numbers,
asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import SHAPES, build_trainer, emit, nll_loss, sync, time_repeats  # noqa: E402


def rkv_like_record(L: int, H: int, prompt: int, n: int, budget: int, divide: int, window: int,
                    g: torch.Generator) -> torch.Tensor:
    """[L, H, n] first query that misses each key, for random kept sets per layer and head."""
    evict = torch.full((L, H, n), n, dtype=torch.int32)
    held = torch.arange(prompt).expand(L, H, prompt)
    for i in range(prompt, n - 1):  # decode step feeding position i, compaction after it
        if held.shape[-1] + 1 < budget + divide:
            held = torch.cat([held, torch.full((L, H, 1), i)], -1)
            continue
        held = torch.cat([held, torch.full((L, H, 1), i)], -1)
        old = held[..., :-window]
        scores = torch.rand(old.shape, generator=g)
        top = scores.topk(budget - window, dim=-1).indices
        kept_old = old.gather(-1, top)
        dropped = torch.ones_like(old, dtype=torch.bool).scatter_(-1, top, False)
        evict.view(L * H, n)[torch.arange(L * H).repeat_interleave(dropped.sum(-1).flatten()),
                             old[dropped]] = i + 1
        held = torch.cat([kept_old.sort(-1).values, held[..., -window:]], -1)
    return evict.to(torch.int16 if n < 32767 else torch.int32)


def make_samples(args, arch) -> list:
    from trainer.learner.packing import Sample

    g = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = []
    for _ in range(args.seqs_per_step):
        r = rng.randint(args.response_len // 2, args.response_len) if args.vary_lengths \
            else args.response_len
        n = args.prompt_len + r
        ids = torch.randint(0, arch.vocab_size, (n,), generator=g).tolist()
        rec = rkv_like_record(arch.num_layers, arch.num_query_groups, args.prompt_len, n,
                              args.budget, args.divide_length, args.window, g)
        out.append(Sample(ids[:args.prompt_len], ids[args.prompt_len:], rec))
    return out


def mask_build_ms(samples, arch, max_tokens: int, device) -> float:
    """Milliseconds to build every layer's masks of the first micro-batch (flex on CUDA)."""
    from trainer.learner.packing import pack, split_by_token_budget
    from trainer.learner.sparse_attention import block_mask

    group = split_by_token_budget([s.length for s in samples], max_tokens)[0]
    batch = pack(samples, group, sparse=True).to(device)
    sync()
    start = time.perf_counter()
    for layer in range(arch.num_layers):
        block_mask(batch.eviction, layer, arch.num_attention_heads)
    sync()
    return 1e3 * (time.perf_counter() - start)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=4096)
    p.add_argument("--vary-lengths", action="store_true")
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--divide-length", type=int, default=128)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--seqs-per-step", type=int, default=16)
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--log-probs-chunk-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def run(args) -> dict:
    from checkpoint_tools import cpu_megatron

    trainer = build_trainer(args)
    arch = trainer.arch
    samples = make_samples(args, arch)
    tokens = sum(s.length for s in samples)
    loss_fn = nll_loss(samples)
    result = dict(shape=args.shape, tokens_per_step=tokens, budget=args.budget,
                  response_len=args.response_len, seqs_per_step=args.seqs_per_step,
                  mask_build_ms=round(mask_build_ms(samples, arch, args.max_tokens_per_gpu,
                                                    cpu_megatron.default_device()), 2))
    for mode, sparse in (("dense", False), ("sparse", True)):
        fwd = lambda: trainer.compute_logprobs(samples, sparse=sparse)  # noqa: E731
        train = lambda: trainer.train_step(samples, loss_fn, sparse=sparse)  # noqa: E731
        for _ in range(args.warmup):
            train()
            fwd()
        for phase, fn in (("recompute", fwd), ("update", train)):
            s = statistics.median(time_repeats(fn, args.steps, args.repeats))
            result[f"{mode}_{phase}_tokens_per_s"] = round(tokens / s)
    for phase in ("recompute", "update"):
        result[f"{phase}_time_ratio"] = round(result[f"dense_{phase}_tokens_per_s"]
                                              / result[f"sparse_{phase}_tokens_per_s"], 3)
    cpu_megatron.teardown()
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    for k, v in result.items():
        print(f"{k:32s} {v}")
    return emit(result, args.json)


if __name__ == "__main__":
    main()
