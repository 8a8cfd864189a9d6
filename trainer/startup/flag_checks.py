"""The value checks of the command-line flags, in one place, run once right after parsing and
before any model work (warm-up, model build, engine start): a bad value is one line naming the
flag the user typed, exit 2, within a second or two (issue 70).

- :func:`check_trainer_values`: ``python -m trainer.train``'s numeric flags (``trainer/arguments.py``
  calls it from ``check_args``). ``--lr -1`` used to reach the optimizer, 20 s and a 45-line
  traceback later.
- :func:`check_quickstart_values`: ``python -m trainer.quickstart``'s own flags, under their own
  names (``--kv-budget``, not the ``--sglang-compress-max-prompt`` it becomes), before its warm-up.

Nothing here imports torch: a flag error stays fast.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """``low <= value`` (``low < value`` when not ``inclusive``), and ``value < below`` when given.
    A flag left at None is automatic and never checked."""

    low: float
    inclusive: bool = True
    below: float | None = None

    def holds(self, value: float) -> bool:
        above = value >= self.low if self.inclusive else value > self.low
        return above and (self.below is None or value < self.below)

    def describe(self) -> str:
        low = f"{'>=' if self.inclusive else '>'} {self.low:g}"
        return low if self.below is None else f"in [{self.low:g}, {self.below:g})"


AT_LEAST_ONE = Bound(1)
NON_NEGATIVE = Bound(0)
BETA = Bound(0, below=1)  # Adam's betas: torch refuses 1 and above with a traceback

# the trainer's flags by dest (slime's names); counts are >= 1, rates and coefficients >= 0
TRAINER_BOUNDS: dict[str, Bound] = {
    **dict.fromkeys(("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len",
                     "num_rollout", "max_tokens_per_gpu", "tensor_model_parallel_size",
                     "pipeline_model_parallel_size", "rollout_concurrency",
                     "rollout_samples_per_request", "lr_decay_iters", "log_probs_chunk_size"),
                    AT_LEAST_ONE),
    **dict.fromkeys(("lr", "min_lr", "weight_decay", "adam_eps", "clip_grad", "lr_warmup_iters"),
                    NON_NEGATIVE),
    "adam_beta1": BETA, "adam_beta2": BETA,
}


def out_of_bounds(args: argparse.Namespace, bounds: dict[str, Bound],
                  names: dict[str, str] | None = None) -> str | None:
    """The first flag outside its bound, as a message naming it (``names``: dest -> the flag
    the user typed, when it is not ``--`` + the dest), or None."""
    for dest, bound in bounds.items():
        value = getattr(args, dest, None)
        if value is not None and not bound.holds(value):
            flag = (names or {}).get(dest, "--" + dest.replace("_", "-"))
            return f"{flag} must be {bound.describe()} (got {value:g})"
    return None


def check_trainer_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    message = out_of_bounds(args, TRAINER_BOUNDS)
    if message:
        parser.error(message)


# the quickstart's own flags; --kv-budget's floor depends on the model (check_quickstart_values)
QUICKSTART_BOUNDS: dict[str, Bound] = {"num_rollout": AT_LEAST_ONE, "warmup_steps": NON_NEGATIVE,
                                       "lr": NON_NEGATIVE}
COMPRESS_ALGORITHMS = ("rkv", "snapkv", "streamingllm", "none")


def check_quickstart_values(parser: argparse.ArgumentParser, args: argparse.Namespace,
                            window: int) -> None:
    """The quickstart's flags by their own names. ``window``: the model's R-KV observation
    window, which the KV budget must exceed (the engine's rule)."""
    message = out_of_bounds(args, QUICKSTART_BOUNDS)
    if message:
        parser.error(message)
    if args.compress_algorithm not in COMPRESS_ALGORITHMS:
        parser.error(f"--compress-algorithm must be one of {', '.join(COMPRESS_ALGORITHMS)} "
                     f"(got {args.compress_algorithm!r})")
    if args.kv_budget is not None and args.kv_budget <= window:
        parser.error(f"--kv-budget must be > {window}, the --model {args.model}'s observation "
                     f"window (got {args.kv_budget})")
