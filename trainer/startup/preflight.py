"""Checks a run script makes before it starts any rank: the trainer's flags (the trainer's own
rules), then every prompt of --prompt-data against the model's context.

    python -m trainer.startup.preflight <the trainer's flags>

A prompt as long as the context can never be generated from: the engine refuses it at the first
rollout, on every rank. Here it is one line with the count, before any rank loads a model.
Exit status 2 = a flag is wrong, 1 = a prompt does not fit, 0 = go.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TooLong:
    count: int
    total: int
    longest: int
    limit: int


def context_length(args) -> int:
    """The engine's context: --sglang-context-length, else the model's max_position_embeddings."""
    cfg = json.loads(Path(args.hf_checkpoint, "config.json").read_text())
    model = cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get(
        "max_position_embeddings") or 1 << 62
    return min(model, getattr(args, "sglang_context_length", None) or model)


def too_long(args, tokenizer) -> TooLong:
    """Prompts that leave no room for a single generated token (the engine's own rule)."""
    from ..rollout.samples.data import load_prompts

    prompts = load_prompts(args.prompt_data, tokenizer, input_key=args.input_key,
                           label_key=args.label_key, apply_chat_template=args.apply_chat_template,
                           max_prompt_len=args.max_prompt_len)
    limit = context_length(args)
    lengths = [len(p.input_ids) for p in prompts]
    return TooLong(sum(n >= limit for n in lengths), len(lengths), max(lengths), limit)


def message(t: TooLong, data: str) -> str:
    return (f"error: {t.count} of {t.total} prompts in {data} are at least the model's context "
            f"({t.limit} tokens; the longest has {t.longest}): drop them or cap them with "
            f"--max-prompt-len")


def main(argv: list[str] | None = None) -> int:
    from ..arguments import parse_args

    with warnings.catch_warnings():  # Megatron's import-time notes would bury the one line
        warnings.simplefilter("ignore")
        args = parse_args(argv)
        from transformers import AutoTokenizer

        from ..rollout.samples.data import DataError
        tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    try:
        t = too_long(args, tokenizer)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if t.count:
        print(message(t, args.prompt_data), file=sys.stderr)
        return 1
    print(f"preflight: {t.total} prompts, the longest {t.longest} tokens, fit the "
          f"{t.limit}-token context")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
