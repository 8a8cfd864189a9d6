"""Sampler quality against the KV budget: the reward of a real model's samples, dense and with
KV compression at several budgets, before any training.

The sparse-rollout claim compares training runs at one budget; this is the sweep that picks the
budget: how much reward the compressed sampler loses at each budget, and how much KV it holds
(peak slots per sample, vs dense's prompt + response). Same prompts, same seeds per budget.

    python -m benchmarks.engine.sampler_budget --model-dir models/SmolLM2-135M-Instruct \
        --budgets 0 40 48 56 64 --prompts 64 --samples 8 --json out.json

The task is the quickstart's (``--task arith``: one-digit arithmetic in the chat template,
gsm8k-style reward, the default) or ``--task chain``: running sums whose every step is checked
(``dataset.long_arith``, ``--rm-type chain``; ``--chain-*`` set its difficulty), which keeps
answers long. SmolLM2 writes that format only after a short warm-up (``trainer.warmup``, the
commands in docs/long_task.md):

    python -m benchmarks.engine.sampler_budget --model-dir models/SmolLM2-135M-Instruct-chain25w12 \
        --task chain --budgets 0 64 96 128 --prompts 16 --samples 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch



def task_rows(a) -> tuple[list[dict], object]:
    """The task's rows and its scorer ``(response, label) -> float``."""
    if a.task == "arith":
        from evaluation.grader.tasks import score_gsm8k
        from trainer.quickstart import smollm2_rows

        return smollm2_rows(a.prompts, a.seed), score_gsm8k
    from dataset.long_arith import ChainConfig, chain_rows
    from evaluation.grader.tasks import score_chain

    config = ChainConfig(a.chain_steps, a.chain_max_number, a.chain_max_start, a.chain_pattern)
    return chain_rows(a.prompts, a.seed, config), score_chain


def prompt_ids(model_dir: str, rows: list[dict]) -> tuple[list[list[int]], list[str]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
             for r in rows]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts], [r["label"] for r in rows]


def engine_args(a, budget: int, tokens: int):
    from sglang_kvc import ServerArgs

    kw = dict(model_path=a.model_dir, max_total_tokens=tokens, max_running_requests=a.prompts * a.samples,
              dtype="bfloat16" if torch.cuda.is_available() else "float32")
    if budget:
        kw.update(compress_algorithm=a.algorithm, compress_max_prompt=budget,
                  compress_divide_length=a.divide_length, compress_max_window=a.window,
                  compress_prompt=a.compress_prompt)
    return ServerArgs(**kw)


def measure(a, budget: int, ids: list[list[int]], labels: list[str], score) -> dict:
    from sglang_kvc import Engine
    from trainer.rollout.engines.inprocess import EngineRollout
    from trainer.rollout.engines.interface import RolloutConfig

    n = a.samples
    per_sample = max(map(len, ids)) + a.max_new_tokens  # dense holds all of it
    engine = Engine(server_args=engine_args(a, budget, len(ids) * n * per_sample + 4096))
    try:
        begin = time.perf_counter()
        gens = EngineRollout(engine).generate(ids, n, RolloutConfig(max_response_len=a.max_new_tokens,
                                                                    seed=a.seed))
        seconds = time.perf_counter() - begin
    finally:
        engine.shutdown()
    rewards = [score(g.text, labels[i // n]) for i, g in enumerate(gens)]
    groups = [rewards[i: i + n] for i in range(0, len(rewards), n)]
    lengths = sorted(len(g.response_ids) for g in gens)
    dense_peak = [len(ids[i // n]) + len(g.response_ids) for i, g in enumerate(gens)]
    peak = [g.meta.get("compression", {}).get("peak_kv_slots", d) for g, d in zip(gens, dense_peak)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"budget": budget, "reward": mean(rewards), "samples": len(gens),
            "reward_stderr": ((mean([r * r for r in rewards]) - mean(rewards) ** 2) / len(gens)) ** 0.5,
            "peak_kv_slots": mean(peak), "dense_peak_kv_slots": mean(dense_peak),
            "response_len": mean(lengths), "response_len_median": lengths[len(lengths) // 2],
            "response_len_p10": lengths[len(lengths) // 10],
            "truncated": mean([g.finish_reason == "length" for g in gens]), "seconds": seconds,
            # GRPO learns only from a prompt whose samples' rewards differ
            "nonzero": mean([r > 0 for r in rewards]), "groups_with_signal": mean([len(set(g)) > 1 for g in groups]),
            "examples": [{"text": g.text, "reward": r} for g, r in list(zip(gens, rewards))[:: n][:4]]}


def main(argv=None) -> int:
    from dataset.long_arith import PATTERNS, ChainConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--budgets", type=int, nargs="+", default=[0, 40, 48, 56, 64],
                   help="--sglang-compress-max-prompt values; 0 = dense")
    p.add_argument("--algorithm", default="rkv")
    p.add_argument("--divide-length", type=int, default=16)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--compress-prompt", action="store_true", help="also compress right after "
                   "prefill when the prompt exceeds the budget (--sglang-compress-prompt)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 160 arith, 400 chain")
    p.add_argument("--task", choices=["arith", "chain"], default="arith")
    p.add_argument("--chain-steps", type=int, default=ChainConfig.steps, help="chain: numbers added per task")
    p.add_argument("--chain-max-number", type=int, default=ChainConfig.max_number, help="chain: each is 1..this")
    p.add_argument("--chain-max-start", type=int, default=ChainConfig.max_start, help="chain: the start is 10..this")
    p.add_argument("--chain-pattern", choices=PATTERNS, default=ChainConfig.pattern,
                   help="chain: the numbers added are listed, one number, or 1, 2, 3, ...")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    a.max_new_tokens = a.max_new_tokens or (400 if a.task == "chain" else 160)
    rows, score = task_rows(a)
    ids, labels = prompt_ids(a.model_dir, rows)
    results = []
    for budget in a.budgets:
        results.append(measure(a, budget, ids, labels, score))
        r = results[-1]
        print(f"budget {budget or 'dense':>5}: reward {r['reward']:.3f} +- {r['reward_stderr']:.3f} "
              f"({r['nonzero']:.0%} of samples > 0, {r['groups_with_signal']:.0%} of prompts with signal), "
              f"peak KV {r['peak_kv_slots']:.0f} slots/sample ({r['peak_kv_slots'] / r['dense_peak_kv_slots']:.0%} "
              f"of its dense peak), response {r['response_len']:.0f} tokens (median "
              f"{r['response_len_median']}, p10 {r['response_len_p10']}, {r['truncated']:.0%} cut at "
              f"{a.max_new_tokens}), {r['seconds']:.1f}s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
