"""Per-request state: tokens, KV bookkeeping, sampled logprobs, finish reason."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: a request is itself, whatever its contents
class Sequence:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # 32-bit key of this request's sampling noise (sampling_seed or drawn by the server)
    group_rid: str | None = None  # the request id the client gave, for abort of n>1 / batches
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    stream: bool = False
    return_text_in_logprobs: bool = False
    on_update: Callable[["Sequence"], Any] | None = None

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None

    status: Status = Status.WAITING
    # KV bookkeeping. `row` is the request's slot-table row; `kv_len` the slots it holds;
    # `num_computed` the logical position of the next token to feed. Dense decoding keeps
    # kv_len == num_computed; compression makes kv_len smaller while positions keep counting.
    row: int | None = None
    kv_len: int = 0
    num_computed: int = 0
    # Output tokens sampled so far, counting a step still running on the GPU (overlap
    # scheduling appends its token to output_ids one step later): the next draw's index.
    num_sampled: int = 0
    # Prefix sharing (kvcache/prefix_cache.py): row[:prefix_len] are slots of the cache's
    # `prefix_node` path, which the request reads under a lock and never frees or writes.
    # `leader`: a batch-mate with the same prompt whose prefill this request shares (it is not
    # computed; it takes the leader's slots and last logits). `cached_tokens`: prompt tokens it
    # did not compute (meta_info).
    prefix_len: int = 0
    prefix_node: Any = None
    leader: "Sequence | None" = None
    cached_tokens: int = 0

    # KV compression: stats for meta_info, and whether compression stopped (after </think>).
    num_compressions: int = 0
    tokens_evicted: int = 0
    peak_kv: int = 0
    compress_stopped: bool = False
    compress: bool = True  # the request's `compress` field (False: dense KV throughout)
    compress_budget: int | None = None  # its budget B (None: the server's --compress-max-prompt)
    # return_eviction_record: which keys each query saw (compression/eviction_record.py)
    eviction: Any = None

    # Sessions (sessions.py): the request's session and the request it continues; its prompt is
    # then that request's context plus the new tokens. `first_prompt_len`: the chain's first
    # prompt (what --compress-keep-prompt pins). `adopted_kv`: its row holds the KV the previous
    # request left (not dense KV of its prompt once compressed: never put in the prefix cache).
    # `turn_head`: with adopted KV, the slots its row holds once its new tokens are prefilled
    # (the adopted KV, fewer slots than positions once compressed, plus the new tokens): what
    # --compress-pin-turns pins. Counted in slots, fixed at adoption.
    session_id: str | None = None
    parent_rid: str | None = None
    continued_len: int = 0  # tokens of the context it continues (the head of prompt_ids)
    first_prompt_len: int | None = None
    adopted_kv: bool = False
    turn_head: int = 0

    finish_reason: dict | None = None
    num_preemptions: int = 0
    created: float = field(default_factory=time.time)
    finished_at: float | None = None
    # Text state (filled by the detokenizer only when text is needed).
    text: str = ""
    detok_offset: int = 0
    detok_read: int = 0
    stop_pos: int = 0  # where a matched stop string starts in `text`

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, i: int) -> int:
        """The i-th token of prompt + output, without building that list (per-step paths)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def can_decode(self, max_seq_len: int) -> bool:
        """Whether another token may be sampled: below max_new_tokens and the context length,
        counting the token of a step still in flight (so no step runs past either limit)."""
        return (self.num_sampled < self.params.max_new_tokens
                and len(self.prompt_ids) + self.num_sampled < max_seq_len)

    def pending_ids(self) -> list[int]:
        """Tokens whose KV is not computed yet: the whole sequence after (re)admission."""
        return self.all_ids[self.num_computed:]
