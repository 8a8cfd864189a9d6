"""How many samples the KV pool holds at once, dense and compressed: the number that decides
whether a long rollout is memory-bound, printed at engine start.

A dense sample holds its prompt plus every generated token: P + L slots at the end. A compressed
sample (budget B, re-compressed every N tokens) never holds more than max(P + 1, B + N) (the
engine's admission bound, compression/trigger.py), nor more than it would densely. With the
prompt kept (``--sglang-compress-keep-prompt``) B and N count response tokens and the prompt is
held whole: P + B + N. With prefix sharing (the engine's default) a group of n samples holds its
prompt once: P + n responses (until a compaction copies a compressed prompt per sample)."""

from __future__ import annotations


def slots_per_sample(prompt_len: int, response_len: int, budget: int | None = None,
                     divide_length: int | None = None, keep_prompt: bool = False) -> int:
    dense = prompt_len + response_len
    if budget is None:
        return dense
    window = budget + (divide_length or 0)
    return min(dense, prompt_len + window if keep_prompt else max(prompt_len + 1, window))


def samples_that_fit(pool_tokens: int, prompt_len: int, response_len: int,
                     budget: int | None = None, divide_length: int | None = None,
                     keep_prompt: bool = False) -> int:
    return pool_tokens // slots_per_sample(prompt_len, response_len, budget, divide_length,
                                           keep_prompt)


def group_slots(prompt_len: int, response_len: int, n: int, budget: int | None = None,
                divide_length: int | None = None, keep_prompt: bool = False) -> int:
    """Peak slots of a group of n samples sharing their prompt: one prompt + n responses (a
    compressed prompt is shared until the first compaction, then each sample holds B + N)."""
    per = slots_per_sample(prompt_len, response_len, budget, divide_length, keep_prompt)
    if budget is None or keep_prompt:
        return prompt_len + n * (per - prompt_len)
    return max(prompt_len + n, n * min(budget + (divide_length or 0), prompt_len + response_len))


def grouped_fit(pool_tokens: int, prompt_len: int, response_len: int, n: int, shared: bool,
                *compression) -> int:
    """Samples the pool holds at once: whole groups of n when they share their prompt."""
    if shared and n > 1:
        return n * (pool_tokens // group_slots(prompt_len, response_len, n, *compression))
    return samples_that_fit(pool_tokens, prompt_len, response_len, *compression)


def capacity_line(pool_tokens: int, prompt_len: int, response_len: int, algorithm: str | None,
                  budget: int | None, divide_length: int | None, keep_prompt: bool = False,
                  n: int = 1, shared: bool = False) -> str:
    """e.g. 'holds 31 samples of 60 + 4096 tokens at once dense, 470 with rkv 512+128'
    ('rkv prompt+512+128' with the prompt kept); with prefix sharing `shared` a group of n
    counts as one prompt + n responses ('..., groups of 8 share a prompt')."""
    dense = grouped_fit(pool_tokens, prompt_len, response_len, n, shared)
    line = f"holds {dense} samples of {prompt_len} + {response_len} tokens at once dense"
    if algorithm:
        sparse = grouped_fit(pool_tokens, prompt_len, response_len, n, shared, budget,
                             divide_length, keep_prompt)
        kept = "prompt+" if keep_prompt else ""
        line += f", {sparse} with {algorithm} {kept}{budget}+{divide_length}"
    if shared and n > 1:
        line += f" (groups of {n} share a prompt)"
    return line


def pool_detail(pool: dict | None) -> str | None:
    """rank 0's engine's KV pool in tokens, GiB and bytes per token (the startup phase line's
    detail; an FP8 pool, --sglang-kv-cache-dtype fp8_*, holds half the bytes per token)."""
    if not pool:
        return None
    gib = pool["capacity"] * pool["bytes_per_slot"] / 2**30
    return (f"KV pool of rank 0's engine: {pool['capacity']} tokens, {gib:.2f} GiB "
            f"({pool['bytes_per_slot']} B/token)")


def run_capacity(pool_tokens: int, engine_flags: dict, prompts: list, response_len: int,
                 n: int = 1) -> str:
    """The pool in samples of the run's mean prompt (of the first 1000) at the configured
    response length, dense and as the ``--sglang-compress-*`` flags compress, groups of `n`
    sharing their prompt unless ``--sglang-disable-radix-cache``."""
    algo = engine_flags.get("compress_algorithm")
    algo = None if str(algo).lower() in ("none", "") else algo
    lens = [len(p.input_ids) for p in prompts[:1000]] or [0]
    return capacity_line(pool_tokens, round(sum(lens) / len(lens)), response_len, algo,
                         engine_flags.get("compress_max_prompt"),
                         engine_flags.get("compress_divide_length"),
                         bool(engine_flags.get("compress_keep_prompt")), n,
                         not engine_flags.get("disable_radix_cache"))
