"""The lm head and per-token log-probs over the vocabulary, forward + backward, for one
micro-batch: the trainer's path (bf16 logits from the GEMM, then ``learner/logprobs.py``'s
Triton passes) against the fused linear-cross-entropy kernels the package index offers, which
never hold the ``[T, V]`` logits: ``cut-cross-entropy`` (``filter_eps=None``: exact
gradients, as RL needs) and ``liger-kernel``'s fused linear cross entropy. Each is optional:
missing, it is reported as such (neither is a dependency of the trainer).

    python -m benchmarks.training.logprob_kernels [--tokens 8192 16384] [--json out.json]

Per kernel: median ms of forward + backward over ``--steps`` (after a warm-up), the peak memory
above the inputs, and the largest |log-prob| and |gradient| difference from the trainer's path
(fp32 reference inputs are not used: all run on the same bf16 tensors). The 0.5B shape by
default (hidden 896, vocab 151,936). Prints numbers, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def ours(hidden, weight, targets):
    from trainer.learner.logprobs import logprobs_and_entropy

    logits = hidden @ weight.t()
    logp, _ = logprobs_and_entropy(logits, targets, with_entropy=False)
    return logp


def cut_cross_entropy(hidden, weight, targets):
    from cut_cross_entropy import linear_cross_entropy

    return -linear_cross_entropy(hidden, weight, targets, reduction="none", filter_eps=None)


def liger(hidden, weight, targets):
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    return -LigerFusedLinearCrossEntropyLoss(reduction="none")(weight, hidden, targets)


KERNELS = {"trainer": ours, "cut_cross_entropy": cut_cross_entropy, "liger": liger}


def inputs(tokens: int, hidden: int, vocab: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(tokens, hidden, generator=g, device="cuda") * 0.5).bfloat16()
    w = (torch.randn(vocab, hidden, generator=g, device="cuda") * 0.02).bfloat16()
    t = torch.randint(0, vocab, (tokens,), generator=g, device="cuda")
    return h.requires_grad_(), w.requires_grad_(), t


def run_once(fn, h, w, t, coef):
    h.grad = w.grad = None
    logp = fn(h, w, t)
    (logp.float() * coef).sum().backward()
    return logp.detach().float(), h.grad.float(), w.grad.float()


def measure(fn, h, w, t, coef, steps: int) -> dict:
    run_once(fn, h, w, t, coef)  # warm-up: compiles, autotunes
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run_once(fn, h, w, t, coef)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return dict(ms=round(1e3 * statistics.median(seconds), 2),
                peak_gib=round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)), out


def compare(tokens: int, args) -> dict:
    h, w, t = inputs(tokens, args.hidden, args.vocab, args.seed)
    coef = torch.randn(tokens, device="cuda")  # per-token advantages of a sort
    result, reference = {}, None
    for name, fn in KERNELS.items():
        try:
            r, out = measure(fn, h, w, t, coef, args.steps)
        except (ImportError, RuntimeError, TypeError, AssertionError) as e:
            result[name] = {"unavailable": f"{type(e).__name__}: {e}"[:200]}
            continue
        if reference is None:
            reference = out
        else:
            r.update(max_logp_diff=float((out[0] - reference[0]).abs().max()),
                     max_grad_diff=max(float((a - b).abs().max())
                                       for a, b in zip(out[1:], reference[1:])))
        result[name] = r
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("logprob_kernels.py: needs a CUDA GPU")
    result = {"gpu": torch.cuda.get_device_name(), "hidden": args.hidden, "vocab": args.vocab,
              **{f"tokens_{n}": compare(n, args) for n in args.tokens}}
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
