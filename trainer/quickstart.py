"""The quickstart: a tiny model learns step-by-step addition with GRPO on R-KV sparse rollouts.

    python -m trainer.quickstart [--workdir runs/quickstart] [--num-rollout 24]

1. A tiny Qwen2.5-style model (random init, tokenizer trained on the spot) is saved in HF format.
2. A short supervised warm-up teaches it the answer *format* on a few demonstrations, so that
   some of its samples are right and GRPO has a signal (a random policy never is).
3. GRPO runs end to end through the real stack: the in-process sglang-kvc engine samples with
   R-KV compression (the KV budget is smaller than every response, so every sample is
   compressed several times), the math grader scores the boxed answers, Megatron recomputes
   π_old densely, the sparse-rollout correction reweights/rejects tokens, and the updated
   weights go back to the engine after every rollout.
The task: ``a+b`` for one-digit ``a``, ``b``, answered by counting up from ``a`` one step per
line and boxing the result, which makes responses long enough that compression really acts.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

PROMPT = "<|im_start|>user\nadd {a} {b}<|im_end|>\n<|im_start|>assistant\n"


def response_text(a: int, b: int) -> str:
    steps = " ".join(f"{a + i}" for i in range(1, b + 1))
    return f"{a} {steps} \\boxed{{{a + b}}}<|im_end|>"


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(3, 9)
        rows.append({"prompt": PROMPT.format(a=a, b=b), "label": str(a + b)})
    return rows


def build_model(out: Path, seed: int) -> Path:
    from checkpoint_tools.tiny_models import make_tiny_model

    overrides = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return make_tiny_model("qwen2.5", out, seed=seed, overrides=overrides)


def warm_up(model_dir: Path, steps: int, seed: int, lr: float = 3e-3) -> float:
    """Supervised steps on demonstrations (response tokens only); returns the final loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed + 1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        pairs = [(rng.randint(1, 9), rng.randint(3, 9)) for _ in range(32)]
        prompts = [tok(PROMPT.format(a=a, b=b), add_special_tokens=False)["input_ids"]
                   for a, b in pairs]
        answers = [tok(response_text(a, b), add_special_tokens=False)["input_ids"]
                   for a, b in pairs]
        width = max(len(p) + len(r) for p, r in zip(prompts, answers))
        ids = torch.full((len(pairs), width), tok.pad_token_id)
        labels = torch.full_like(ids, -100)
        for i, (p, r) in enumerate(zip(prompts, answers)):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(model_dir)
    return float(loss)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="runs/quickstart")
    p.add_argument("--num-rollout", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compress-algorithm", default="rkv")
    p.add_argument("--kv-budget", type=int, default=20, help="--sglang-compress-max-prompt")
    p.add_argument("--lr", type=float, default=3e-4)
    args, extra = p.parse_known_args(argv)  # anything else goes to trainer.train
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    model_dir = build_model(work / "model", args.seed)
    loss = warm_up(model_dir, args.warmup_steps, args.seed)
    print(f"[quickstart] warm-up: {args.warmup_steps} supervised steps, final loss {loss:.3f}")
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(2000, args.seed)))

    from .train import main as train_main

    train_args = [
        "--hf-checkpoint", str(model_dir), "--prompt-data", str(data),
        "--save", str(work / "ckpt"), "--log-dir", str(work / "logs"),
        "--num-rollout", str(args.num_rollout), "--rollout-batch-size", "16",
        "--n-samples-per-prompt", "8", "--global-batch-size", "128",
        "--rollout-max-response-len", "40", "--rollout-temperature", "1.0",
        "--lr", str(args.lr), "--lr-decay-style", "cosine", "--min-lr", str(args.lr / 10),
        "--lr-decay-iters", str(args.num_rollout), "--adam-beta2", "0.99", "--weight-decay", "0.0",
        "--kl-loss-coef", "0", "--rm-type", "math", "--max-tokens-per-gpu", "4096",
        "--seed", str(args.seed),
        "--sglang-max-total-tokens", "16384", "--sglang-max-running-requests", "128",
    ]
    # R-KV keeps 20 generated tokens (+ a 4-token buffer): responses run 10-40 tokens, and the
    # average sample is compressed ~4 times, so the sampler really is the sparse policy.
    if args.compress_algorithm != "none":
        train_args += ["--sglang-compress-algorithm", args.compress_algorithm,
                       "--sglang-compress-max-prompt", str(args.kv_budget),
                       "--sglang-compress-divide-length", "4", "--sglang-compress-max-window", "4"]
    train_main(train_args + extra)
    rewards = [json.loads(line)["reward_mean"] for line in open(work / "logs" / "metrics.jsonl")]
    k = max(1, min(5, len(rewards) // 2))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"[quickstart] reward mean, first {k} rollouts {first:.3f} -> last {k} {last:.3f} "
          f"({last - first:+.3f}); {time.perf_counter() - start:.0f}s in all; logs and plots in "
          f"{work / 'logs'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
