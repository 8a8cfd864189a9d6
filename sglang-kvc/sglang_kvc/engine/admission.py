"""Admission control: what one request may ask for, and how much the engine queues at once.

Three bounds, checked before a request's samples are built (so `n = 10^8` never allocates):

* `n` per prompt <= --max-n: HTTP 400 (the request can never be served as sent).
* Samples and tokens of one request <= the queue bounds: otherwise HTTP 400 too.
* Samples and tokens the engine holds unfinished (waiting + running), this request included,
  <= --max-queued-requests / --max-queued-tokens: otherwise `QueueFull`, HTTP 503 with
  Retry-After (the request is fine, the server is busy: SGLang's answer to a full queue).

A sample's tokens are its prompt plus the output it may still produce (max_new_tokens, capped by
the context as generation is): the work it brings, whatever compression later keeps of its KV.
With prefix sharing, samples of one call with the same prompt (a request's n) count it once:
the first carries the prompt, the others their output only. A session's request continuing an
earlier one (engine/sessions.py) counts its new tokens and output, not the context it continues.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


class QueueFull(RuntimeError):
    """The engine holds as much as it may queue: retry later (HTTP 503)."""


@dataclass
class AdmissionLimits:
    max_n: int
    max_queued_requests: int  # samples, since each of a request's n samples is queued on its own
    max_queued_tokens: int


@dataclass
class Demand:
    samples: int
    tokens: int


def sample_tokens(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> int:
    return min(prompt_len + max_new_tokens, max_seq_len)


def check_n(items, max_n: int) -> None:
    """400 before anything is built: the request's n and its sample count."""
    for it in items:
        if it.params.n > max_n:
            raise ValueError(f"n={it.params.n} is above this server's limit of {max_n} samples "
                             f"per prompt (--max-n)")


class Admission:
    """Counts what the engine holds unfinished; callers `admit` a demand and `release` each
    sample's share when it finishes. Thread-safe: HTTP handlers admit, the engine thread
    releases."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self.samples = 0
        self.tokens = 0
        self._lock = threading.Lock()

    def check_alone(self, d: Demand) -> None:
        """400: a request that could not be queued even on an idle server."""
        lim = self.limits
        if d.samples > lim.max_queued_requests:
            raise ValueError(f"the request has {d.samples} samples; this server queues at most "
                             f"{lim.max_queued_requests} (--max-queued-requests)")
        if d.tokens > lim.max_queued_tokens:
            raise ValueError(f"the request needs up to {d.tokens} tokens (prompt + max_new_tokens, "
                             f"times its samples); this server queues at most "
                             f"{lim.max_queued_tokens} (--max-queued-tokens): lower n or max "
                             f"tokens")

    def admit(self, d: Demand) -> None:
        self.check_alone(d)
        lim = self.limits
        with self._lock:
            if (self.samples + d.samples > lim.max_queued_requests
                    or self.tokens + d.tokens > lim.max_queued_tokens):
                raise QueueFull(f"server busy: {self.samples} samples ({self.tokens} tokens) "
                                f"queued or running, limits {lim.max_queued_requests} samples / "
                                f"{lim.max_queued_tokens} tokens; retry later")
            self.samples += d.samples
            self.tokens += d.tokens

    def release(self, tokens: int) -> None:
        """One sample finished (or was aborted, or failed)."""
        with self._lock:
            self.samples -= 1
            self.tokens -= tokens


def token_shares(seqs, max_seq_len: int, shared: bool = False) -> list[int]:
    """Each sample's tokens; with `shared`, a prompt already counted for an earlier sample of
    `seqs` is left out of the later ones. A session's request does not count the context it
    continues (its session holds that KV already)."""
    seen: set[tuple] = set()
    shares = []
    for s in seqs:
        total = sample_tokens(len(s.prompt_ids), s.params.max_new_tokens, max_seq_len)
        total -= s.continued_len
        key = tuple(s.prompt_ids)
        if shared and key in seen:
            total -= len(s.prompt_ids)
        seen.add(key)
        shares.append(total)
    return shares



def counted(notify, admission: Admission, tokens: int):
    """`notify` that gives the sample's share back to `admission` when it finishes."""
    def on_update(out: dict, finished: bool) -> None:
        if finished:
            admission.release(tokens)
        notify(out, finished)
    return on_update


def limits_from_args(args, pool_tokens: int) -> AdmissionLimits:
    """--max-queued-tokens unset: 64 KV pools of work. The pool turns over as requests finish;
    deeper than that, the last request would wait behind 64 full pools of generation, and a 503
    lets a router send it elsewhere. Rollout batches of the recipes stay far below it."""
    tokens = args.max_queued_tokens or 64 * pool_tokens
    return AdmissionLimits(args.max_n, args.max_queued_requests, tokens)
