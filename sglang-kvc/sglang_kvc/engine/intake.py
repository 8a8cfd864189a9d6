"""Request intake: a parsed `/generate` item becomes its n sequences, checked against the
vocabulary and the context length, each with its own seed and a callback that resolves its
future (and streams, when asked)."""

from __future__ import annotations

import concurrent.futures
import random
from dataclasses import dataclass
from typing import Any, Callable

from ..compression.eviction_record import EvictionTracker
from .io_struct import GenerateItem
from .sequence import Sequence
from .sessions import SessionContext

UpdateFn = Callable[[dict, bool], Any]  # (output dict, finished)


@dataclass
class IntakeLimits:
    vocab_size: int
    max_seq_len: int
    kv_shape: tuple[int, int] = (0, 0)  # (layers, KV heads): the eviction record's leading dims
    compression: Any = None  # the server's CompressionConfig (None: dense), for request budgets


def prompt_ids(item: GenerateItem, tokenizer) -> list[int]:
    if item.input_ids is not None:
        return item.input_ids
    if tokenizer is None:
        raise ValueError("text input needs a tokenizer (server runs --skip-tokenizer-init)")
    ids = tokenizer.encode(item.text)
    if not ids:
        raise ValueError("text tokenizes to no tokens")
    return ids


def check_prompt(ids: list[int], item: GenerateItem, limits: IntakeLimits) -> None:
    vocab = limits.vocab_size
    if min(ids) < 0 or max(ids) >= vocab:
        bad = [t for t in ids if not 0 <= t < vocab]
        raise ValueError(f"token id(s) {bad[:5]} out of vocabulary [0, {vocab})")
    if len(ids) >= limits.max_seq_len:
        raise ValueError(f"the input ({len(ids)} tokens) is longer than the model's context "
                         f"length ({limits.max_seq_len} tokens)")
    bias = item.params.logit_bias or {}
    if bias and (min(bias) < 0 or max(bias) >= vocab):
        raise ValueError(f"logit_bias token id(s) {[t for t in bias if not 0 <= t < vocab][:5]} "
                         f"out of vocabulary [0, {vocab})")
    if item.refuse_past_context:
        check_total(len(ids), item.params.max_new_tokens, limits.max_seq_len)
    if item.compress_budget is not None and limits.compression is not None:
        limits.compression.check_budget(item.compress_budget)
    if item.logprob_start_len >= len(ids):
        raise ValueError(f"logprob_start_len ({item.logprob_start_len}) must be < the prompt "
                         f"length ({len(ids)})")


def check_total(prompt_len: int, max_new: int, context: int) -> None:
    """SGLang's 400 (its wording) for a prompt plus max_new_tokens that reaches the context."""
    if prompt_len + max_new >= context:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {prompt_len + max_new} tokens: {prompt_len} tokens "
            f"from the input messages and {max_new} tokens for the completion. Please reduce the "
            f"number of tokens in the input messages or the completion to fit within the limit.")


def make_sequences(item: GenerateItem, tokenizer, limits: IntakeLimits,
                   rng: random.Random, session: SessionContext | None = None) -> list[Sequence]:
    """The item's n samples; sample i of a seeded request draws with seed + i. A session's
    request (`session`, sessions.py) has as prompt the context it continues plus its tokens."""
    ids = prompt_ids(item, tokenizer)
    if session is not None and session.parent_rid is not None:
        if item.logprob_start_len >= 0:
            raise ValueError("logprob_start_len is not supported on a request continuing a "
                             "session (the context before its tokens is not recomputed)")
        ids = session.ids + ids
    check_prompt(ids, item, limits)
    n = item.params.n
    seqs = []
    for i in range(n):
        if item.params.sampling_seed is not None:
            seed = (item.params.sampling_seed + i) & 0xFFFFFFFF
        else:
            seed = rng.getrandbits(32)
        seqs.append(Sequence(
            rid=item.rid if n == 1 else f"{item.rid}-{i}", group_rid=item.rid,
            prompt_ids=list(ids), params=item.params, seed=seed,
            return_logprob=item.return_logprob, top_logprobs_num=item.top_logprobs_num,
            logprob_start_len=item.logprob_start_len, stream=item.stream,
            return_text_in_logprobs=item.return_text_in_logprobs,
            # the trigger never fires for a stopped request: it keeps its whole KV
            compress_stopped=not item.compress, compress=item.compress,
            compress_budget=item.compress_budget,
            eviction=EvictionTracker(*limits.kv_shape) if item.return_eviction_record else None))
    if session is not None:
        seqs[0].session_id, seqs[0].parent_rid = session.session_id, session.parent_rid
        seqs[0].first_prompt_len = session.first_prompt_len or len(ids)
        seqs[0].continued_len = len(session.ids)
    return seqs


def notifier(fut: concurrent.futures.Future, on_update: UpdateFn | None) -> UpdateFn:
    def notify(out: dict, finished: bool):
        if on_update is not None:
            on_update(out, finished)
        if finished and not fut.done():
            fut.set_result(out)
    return notify
