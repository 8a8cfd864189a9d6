"""When a request compresses, and the most KV slots it can hold from now on.

The trigger is per request (the reference used a batch step counter that restarted whenever
requests joined). It runs after a step, when the step's new KV is in the cache:
- after a prefill: when the request holds more than B tokens and either prompt compression is
  on or the request is being recomputed after preemption (it already generated tokens);
- after a decode step: step_length -> once B + N tokens are held (so every N steps, back to B);
  newline -> when the token just fed is newline-like and more than B are held, and also at
  B + N so the footprint stays bounded whatever the text looks like;
- never after the request fed `</think>` when stop_after_think is set (it then grows densely).

With keep_prompt the request's first P slots (its prompt) are *pinned*: never scored nor
evicted. Every rule above then counts response slots only (held - P): the response part is
compressed back to B once it holds B + N (or after a newline with more than B), so the request
holds at most P + B + N slots, and after a compaction exactly P + B. The divide length N is
unchanged (every N decode steps); prompt compression at prefill cannot be combined with it.

A session's request (engine/sessions.py) continues the KV its previous request left: the first
prompt of the chain is what keep_prompt pins, and its new tokens (the observation) are held
like decoded ones, compressed after their prefill once pinned + B + N are held.
With pin_turns (--compress-pin-turns) a session request that adopted KV pins instead everything
its row holds after its prefill (`Sequence.turn_head`, in slots: the adopted KV, compressed or
not, plus its new tokens, e.g. a tool's response), so the observations are never evicted and
each turn's compactions score that turn's generated tokens only; the turn holds at most
turn_head + B + N. A request without adopted KV (a chain's first, one whose parked KV was
dropped, one preempted and recomputed densely) pins its whole prompt, as keep_prompt does.
"""

from __future__ import annotations

from .base import CompressionConfig


class Trigger:
    def __init__(self, cfg: CompressionConfig, newline_ids: set[int] | None = None,
                 think_end_id: int | None = None):
        if cfg.divide_method == "newline" and not newline_ids:
            raise ValueError("--compress-divide-method newline needs a tokenizer (newline token ids)")
        self.cfg = cfg
        self.newline_ids = newline_ids or set()
        self.think_end_id = think_end_id if cfg.stop_after_think else None

    def observe(self, seq) -> None:
        """Note what the step just fed (call before `should_compress`)."""
        if self.think_end_id is not None and seq.output_ids and seq.num_computed > len(seq.prompt_ids):
            if seq.token_at(seq.num_computed - 1) == self.think_end_id:
                seq.compress_stopped = True

    def pinned(self, seq) -> int:
        """Slots at the head of the request's row that are never evicted: its prompt; for a
        session's request the first prompt of its chain (observations are evictable), or with
        pin_turns its turn's head (the adopted KV and the observation)."""
        if not self.cfg.keep_prompt:
            return 0
        if self.cfg.pin_turns:
            # preemption clears adopted_kv: recomputed densely, the row's head is the prompt
            return seq.turn_head if seq.adopted_kv else len(seq.prompt_ids)
        return seq.first_prompt_len if seq.first_prompt_len is not None else len(seq.prompt_ids)

    def budget(self, seq) -> int:
        """B for this request (its `compress_budget`, else the server's): evictable slots kept
        by a compaction."""
        return seq.compress_budget or self.cfg.budget

    def floor(self, seq) -> int:
        """Slots a compaction leaves (pinned + B): at or below it there is nothing to do."""
        return self.pinned(seq) + self.budget(seq)

    def should_compress(self, seq, is_prefill: bool) -> bool:
        c = self.cfg
        floor = self.floor(seq)
        if seq.compress_stopped or seq.kv_len <= floor:
            return False
        if is_prefill:
            # A session request's new tokens, prefilled after the KV it adopted, count as
            # decoded tokens would: compress once pinned + B + N are held.
            grown = seq.adopted_kv and seq.kv_len >= floor + c.divide_length
            return c.compress_prompt or bool(seq.output_ids) or grown
        if seq.kv_len >= floor + c.divide_length:
            return True
        return c.divide_method == "newline" and seq.token_at(seq.num_computed - 1) in self.newline_ids

    def bound(self, seq, held: int) -> int:
        """Most slots the request will hold at any step end from now on, given it holds (or,
        waiting, will hold after its prefill) `held` slots. A decode step adds one slot and
        compression runs once pinned + B + N are held, so the peak is max(held + 1, pinned + B +
        N), never more than growing densely to the end (held + tokens still to generate). The
        pinned prompt is part of the bound: admission reserves it, so a kept prompt never forces
        a preemption."""
        dense = held + max(seq.params.max_new_tokens - len(seq.output_ids), 0)
        if seq.compress_stopped:
            return dense
        return min(dense, max(held + 1, self.floor(seq) + self.cfg.divide_length))
