"""How many samples the KV pool holds at once, dense and compressed: the number that decides
whether a long rollout is memory-bound, printed at engine start.

A dense sample holds its prompt plus every generated token: P + L slots at the end. A compressed
sample (budget B, re-compressed every N tokens) never holds more than max(P + 1, B + N) (the
engine's admission bound, compression/trigger.py), nor more than it would densely. With the
prompt kept (``--sglang-compress-keep-prompt``) B and N count response tokens and the prompt is
held whole: P + B + N."""

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


def capacity_line(pool_tokens: int, prompt_len: int, response_len: int, algorithm: str | None,
                  budget: int | None, divide_length: int | None, keep_prompt: bool = False) -> str:
    """e.g. 'holds 31 samples of 60 + 4096 tokens at once dense, 470 with rkv 512+128'
    ('rkv prompt+512+128' with the prompt kept)."""
    dense = samples_that_fit(pool_tokens, prompt_len, response_len)
    line = f"holds {dense} samples of {prompt_len} + {response_len} tokens at once dense"
    if algorithm:
        sparse = samples_that_fit(pool_tokens, prompt_len, response_len, budget, divide_length,
                                  keep_prompt)
        kept = "prompt+" if keep_prompt else ""
        line += f", {sparse} with {algorithm} {kept}{budget}+{divide_length}"
    return line
