"""A decode step's tokens handed to its requests in one lean pass.

At batch 256 this is the engine thread's largest host cost per step (~0.4-0.8 ms through the
general path: a finish check, dict lookups and attribute reads per request), and with overlap
scheduling host time beyond the GPU's step time is the step's time. Most requests of an RL
rollout need nothing but their token and log-prob appended: no streaming, no stop strings, no
top log-probs. For those the pass appends and flags only the rows that may have ended (a stop
id found on the GPU, or the output length at the request's limit), which then take the full
finish check; every other request takes the general path. Same outcome, token for token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from .sequence import Sequence, Status

_FINISHED = Status.FINISHED
_status = attrgetter("status")


@dataclass
class RowPlan:
    """What the pass needs of a decode batch's requests, built once per batch (scheduler
    version and size: the same pair is the same requests in the same order)."""
    key: tuple
    limits: list[int]  # output length at which a request must be checked (max_new or context)
    plain: list[bool]  # token and log-prob appended, nothing else, unless it may have ended
    # Every request plain: the whole batch is appended column-wise (map over the lists, C
    # loops), its ended rows found with numpy.
    all_plain: bool
    outputs: list[list[int]]  # each request's output_ids (the lists themselves)
    output_logprobs: list[list[float]]
    limit_array: np.ndarray


def plan_rows(seqs: list[Sequence], key: tuple, max_seq_len: int) -> RowPlan:
    limits = [min(s.params.max_new_tokens, max_seq_len - len(s.prompt_ids)) for s in seqs]
    plain = [not (s.stream or s.params.stop or s.top_logprobs_num or s.params.max_new_tokens == 0)
             for s in seqs]
    return RowPlan(key, limits, plain, all(plain), [s.output_ids for s in seqs],
                   [s.output_logprobs for s in seqs], np.array(limits, dtype=np.int64))


def append_plain(seqs: list[Sequence], ids: list[int], logprobs: list[float] | None,
                 hits: list[bool], plan: RowPlan) -> tuple[list[int], list[int]]:
    """Append the plain live requests' tokens (and log-probs when asked); returns (indices of
    plain requests that may have ended, indices of live requests for the general path)."""
    if plan.all_plain and _FINISHED not in map(_status, seqs):  # (identity compares, in C)
        return _append_columns(ids, logprobs, hits, plan), []
    check, general = [], []
    lps = logprobs if logprobs is not None else ids  # (read only when asked)
    for i, (seq, tok, lp, hit, limit, plain) in enumerate(
            zip(seqs, ids, lps, hits, plan.limits, plan.plain)):
        if seq.status is _FINISHED:
            continue
        if not plain:
            general.append(i)
            continue
        out = seq.output_ids
        out.append(tok)
        if logprobs is not None:  # as the general path: every row, when the step has them
            seq.output_logprobs.append(lp)
        if hit or len(out) >= limit:
            check.append(i)
    return check, general


def _append_columns(ids: list[int], logprobs: list[float] | None, hits: list[bool],
                    plan: RowPlan) -> list[int]:
    """append_plain for a batch of live plain requests: each column in one C-level pass."""
    deque(map(list.append, plan.outputs, ids), maxlen=0)
    if logprobs is not None:
        deque(map(list.append, plan.output_logprobs, logprobs), maxlen=0)
    lengths = np.fromiter(map(len, plan.outputs), dtype=np.int64, count=len(ids))
    ended = lengths >= plan.limit_array
    if any(hits):
        ended |= np.asarray(hits, dtype=bool)
    return np.flatnonzero(ended).tolist()
