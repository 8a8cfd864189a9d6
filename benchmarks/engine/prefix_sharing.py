"""Prefix sharing at a fixed KV pool: dense vs R-KV (prompt kept), each with and without sharing
(`--disable-radix-cache`), in one process on one GPU.

A rollout is `--groups` GRPO groups of `--n` samples (each sample its own request, with its own
length, all in one batched call) with long-tailed response lengths (common/long_tail.py: log-normal
around a quarter of `--response-cap`, ~12% at the cap), on random weights of the 0.5B shape (throughput.py). Prompts
are chain tasks (dataset/long_arith.py) as character ids, cut to `--prompt-lens`; past the chain
question's length a few-shot block of worked chain answers, the same for every group, comes first
(a shared system / few-shot prompt). Each config is one engine (pool at `--pool-tokens` slots,
warmed up) that runs every workload in turn, its prefix cache flushed in between. Reported per
rollout:

    pool_peak        most slots requests held at once (shared slots once), and per group
    held_at_once     most samples running at once
    prefill_tokens   tokens the prefills computed (the prompt once per group with sharing)
    rollout_s        wall seconds of the rollout
    vs_dense         pool_peak / dense-without-sharing's at the same prompt length

plus an n = 1 pass (`--n1-groups` distinct prompts of the first length, responses up to
`--n1-response-cap`) showing that sharing costs nothing when nothing is shared. RL step seconds are not measured here (training/rl_step.py
runs the whole loop; its trainer runs with sharing on by default).

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.prefix_sharing --json runs/prefix.json
    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.prefix_sharing --smoke   # CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.long_tail import long_tail_length
from benchmarks.engine.throughput import UNFILTERED
from dataset.long_arith import chain_rows

CONFIGS = ("dense", "dense+share", "rkv", "rkv+share")


def char_ids(text: str, vocab: int) -> list[int]:
    """Text as token ids, one per character (random weights: only lengths and repeats matter)."""
    return [3 + ord(c) % (vocab - 3) for c in text]


def make_prompts(groups: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`groups` prompts of `length` ids: a shared few-shot block of worked chain answers, then
    each group's own chain question (its head, with the numbers, when the question alone is
    longer)."""
    rows = chain_rows(groups + 64, seed)
    questions = [char_ids(r["prompt"][0]["content"], vocab) for r in rows[:groups]]
    shots: list[int] = []
    for r in rows[groups:]:
        shots += char_ids(r["prompt"][0]["content"] + "\n" + r["solution"] + "\n\n", vocab)
    out = []
    for q in questions:
        head = shots[:max(length - len(q), 0)]
        out.append(head + q[:length])
    return out


def response_lengths(count: int, cap: int, seed: int) -> list[int]:
    return [long_tail_length(i, seed, cap, 0.25, 0.8, max(1, min(64, cap // 8))) for i in range(count)]


def engine_kwargs(config: str, args) -> dict:
    kw = dict(disable_radix_cache="+share" not in config, max_total_tokens=args.pool_tokens,
              skip_tokenizer_init=True, random_seed=args.seed)
    if config.startswith("rkv"):
        kw.update(compress_algorithm="rkv", compress_max_prompt=args.budget,
                  compress_divide_length=args.divide_length, compress_keep_prompt=True)
    return kw


def run(path: str, config: str, workloads: list[tuple[list[list[int]], int, int]], args) -> list[dict]:
    """One engine for `config` (one start-up, one set of graph captures) and every (prompts,
    n, response cap) workload in turn, the prefix cache flushed in between."""
    from sglang_kvc import Engine

    ctx = max(len(p) + cap for prompts, _, cap in workloads for p in prompts) + 16
    engine = Engine(model_path=path, device=args.device, context_length=ctx,
                    max_running_requests=args.max_running, **engine_kwargs(config, args))
    try:
        engine.generate(input_ids=workloads[0][0][0], sampling_params={
            "max_new_tokens": 8, "n": workloads[0][1], "ignore_eos": True})  # warm-up
        out = []
        for prompts, n, cap in workloads:
            engine.flush_cache()
            lengths = response_lengths(len(prompts) * n, cap, args.seed)
            out.append(timed(engine, prompts, n, lengths))
        return out
    finally:
        engine.shutdown()


def timed(engine, prompts: list[list[int]], n: int, lengths: list[int]) -> dict:
    """One rollout: every group's n samples at once (their own lengths), timed."""
    sch, runner = engine.scheduler, engine.runner
    sch.max_running = sch.num_preemptions = 0
    engine.kv.allocator.peak_used = 0
    runner.prefill_tokens = 0
    ids = [p for p in prompts for _ in range(n)]  # a group's samples share a prompt
    params = [{"max_new_tokens": m, "ignore_eos": True, "temperature": 1.0, "sampling_seed": i,
               **UNFILTERED} for i, m in enumerate(lengths)]
    t0 = time.perf_counter()
    futures = engine.submit_generate({"input_ids": ids, "sampling_params": params})
    outs = [f.result() for f in futures]
    seconds = time.perf_counter() - t0
    peak = engine.kv.allocator.peak_used
    return {"pool_peak": peak, "pool_peak_per_group": peak / len(prompts),
            "held_at_once": sch.max_running, "prefill_tokens": runner.prefill_tokens,
            "preemptions": sch.num_preemptions, "rollout_s": seconds,
            "tokens": sum(len(o["output_ids"]) for o in outs),
            "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[200, 1000, 2000])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--n1-groups", type=int, default=32, help="distinct prompts of the n = 1 pass")
    p.add_argument("--response-cap", type=int, default=4096)
    p.add_argument("--n1-response-cap", type=int, default=1024, help="the n = 1 pass's cap")
    p.add_argument("--pool-tokens", type=int, default=32768)
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--divide-length", type=int, default=32)
    p.add_argument("--max-running", type=int, default=128)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--json", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU, seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.device, args.prompt_lens, args.groups, args.n = "tiny", "cpu", [24, 60], 2, 4
        args.n1_groups, args.response_cap, args.pool_tokens, args.budget = 4, 32, 600, 10
        args.n1_response_cap, args.divide_length = 16, 4
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(args.shape, Path(tmp), args.seed, torch.bfloat16)
        vocab = json.loads((Path(tmp) / "config.json").read_text())["vocab_size"]
        workloads = [(make_prompts(args.groups, length, vocab, args.seed), args.n, args.response_cap)
                     for length in args.prompt_lens]
        workloads.append((make_prompts(args.n1_groups, args.prompt_lens[0], vocab, args.seed + 1), 1,
                          args.n1_response_cap))
        runs = {config: run(tmp, config, workloads, args) for config in args.configs}
    rows = []
    for i, (prompts, n, _) in enumerate(workloads):
        rows += report([{"config": c, "prompt_len": len(prompts[0]), "n": n, **runs[c][i]}
                        for c in args.configs])
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


def report(rows: list[dict]) -> list[dict]:
    """One workload's rows, with each pool peak relative to dense-without-sharing's, printed."""
    base = next((r["pool_peak"] for r in rows if r["config"] == "dense"), None)
    for r in rows:
        r["vs_dense"] = r["pool_peak"] / base if base else None
        print(f"P={r['prompt_len']:5d} n={r['n']} {r['config']:12s} peak {r['pool_peak']:7d} "
              f"({r['pool_peak_per_group']:8.0f}/group, {r['vs_dense'] or 0:.2f} of dense) "
              f"held {r['held_at_once']:3d}  prefill {r['prefill_tokens']:7d}  "
              f"preempt {r['preemptions']:3d}  {r['rollout_s']:6.1f} s", flush=True)
    return rows


if __name__ == "__main__":
    main()
