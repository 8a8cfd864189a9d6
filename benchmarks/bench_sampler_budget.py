"""Sampler quality against the KV budget: the reward of a real model's samples, dense and with
KV compression at several budgets, before any training.

The sparse-rollout claim compares training runs at one budget; this is the sweep that picks the
budget: how much reward the compressed sampler loses at each budget, and how much KV it holds
(peak slots per sample, vs dense's prompt + response). Same prompts, same seeds per budget.

    python benchmarks/bench_sampler_budget.py --model-dir models/SmolLM2-135M-Instruct \
        --budgets 0 40 48 56 64 --prompts 64 --samples 8 --json out.json

The task is the quickstart's (one-digit arithmetic in the chat template, gsm8k-style reward).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sglang-kvc")]


def prompt_ids(model_dir: str, n: int, seed: int) -> tuple[list[list[int]], list[str]]:
    from transformers import AutoTokenizer

    from trainer.quickstart import smollm2_rows

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = smollm2_rows(n, seed)
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
             for r in rows]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts], [r["label"] for r in rows]


def engine_args(a, budget: int, tokens: int):
    from sglang_kvc.server_args import ServerArgs

    kw = dict(model_path=a.model_dir, max_total_tokens=tokens, max_running_requests=a.prompts * a.samples,
              dtype="bfloat16" if torch.cuda.is_available() else "float32")
    if budget:
        kw.update(compress_algorithm=a.algorithm, compress_max_prompt=budget,
                  compress_divide_length=a.divide_length, compress_max_window=a.window)
    return ServerArgs(**kw)


def measure(a, budget: int, ids: list[list[int]], labels: list[str]) -> dict:
    from evaluation.grader.tasks import score_gsm8k
    from sglang_kvc.engine.engine import Engine
    from trainer.rollout.backends import EngineRollout, RolloutConfig

    n = a.samples
    engine = Engine(server_args=engine_args(a, budget, len(ids) * n * (a.max_new_tokens + 80) + 4096))
    try:
        begin = time.perf_counter()
        gens = EngineRollout(engine).generate(ids, n, RolloutConfig(max_response_len=a.max_new_tokens,
                                                                    seed=a.seed))
        seconds = time.perf_counter() - begin
    finally:
        engine.shutdown()
    rewards = [score_gsm8k(g.text, labels[i // n]) for i, g in enumerate(gens)]
    dense_peak = [len(ids[i // n]) + len(g.response_ids) for i, g in enumerate(gens)]
    peak = [g.meta.get("compression", {}).get("peak_kv_slots", d) for g, d in zip(gens, dense_peak)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"budget": budget, "reward": mean(rewards), "samples": len(gens),
            "reward_stderr": (mean(rewards) * (1 - mean(rewards)) / len(gens)) ** 0.5,
            "peak_kv_slots": mean(peak), "dense_peak_kv_slots": mean(dense_peak),
            "response_len": mean([len(g.response_ids) for g in gens]), "seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--budgets", type=int, nargs="+", default=[0, 40, 48, 56, 64],
                   help="--sglang-compress-max-prompt values; 0 = dense")
    p.add_argument("--algorithm", default="rkv")
    p.add_argument("--divide-length", type=int, default=16)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    ids, labels = prompt_ids(a.model_dir, a.prompts, a.seed)
    results = []
    for budget in a.budgets:
        results.append(measure(a, budget, ids, labels))
        r = results[-1]
        print(f"budget {budget or 'dense':>5}: reward {r['reward']:.3f} +- {r['reward_stderr']:.3f}, "
              f"peak KV {r['peak_kv_slots']:.0f} slots/sample ({r['peak_kv_slots'] / r['dense_peak_kv_slots']:.0%} "
              f"of its dense peak), response {r['response_len']:.0f} tokens, {r['seconds']:.1f}s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
