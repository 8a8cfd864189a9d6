"""Token ids -> text, incrementally, for streaming and stop strings.

Text is produced only when something needs it (a stop string, a stream, the final response), so
a rollout of token ids with no stop strings never pays for decoding per step. Incremental decoding
re-decodes a short window (from the last emitted boundary) and holds back text that ends in an
incomplete UTF-8 sequence, so multi-byte characters split across tokens come out whole.
"""

from __future__ import annotations

from .sequence import Sequence


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], seq: Sequence) -> str:
        if self.tokenizer is None:
            return ""
        p = seq.params
        kwargs = {"skip_special_tokens": p.skip_special_tokens}
        if not p.spaces_between_special_tokens:
            kwargs["spaces_between_special_tokens"] = False
        try:
            return self.tokenizer.decode(ids, **kwargs)
        except TypeError:  # fast tokenizers without that option
            kwargs.pop("spaces_between_special_tokens", None)
            return self.tokenizer.decode(ids, **kwargs)

    def update(self, seq: Sequence) -> str:
        """Extend seq.text with what the new output tokens add; returns the added text."""
        ids = seq.output_ids
        prefix = self.decode(ids[seq.detok_offset:seq.detok_read], seq)
        full = self.decode(ids[seq.detok_offset:], seq)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            seq.text += delta
            seq.detok_offset, seq.detok_read = seq.detok_read, len(ids)
            return delta
        return ""

    def find_stop(self, seq: Sequence, delta: str) -> tuple[str, int] | None:
        """The first stop string that now appears in seq.text, and where it starts."""
        if not delta:
            return None
        longest = max(len(s) for s in seq.params.stop)
        start = max(0, len(seq.text) - len(delta) - longest + 1)
        best = None
        for s in seq.params.stop:
            pos = seq.text.find(s, start)
            if pos >= 0 and (best is None or pos < best[1]):
                best = (s, pos)
        return best

    def final_text(self, seq: Sequence) -> str:
        """The response text: stop strings trimmed and matched stop tokens dropped, unless
        no_stop_trim (then everything generated is decoded)."""
        ids = seq.output_ids
        reason = seq.finish_reason or {}
        matched = reason.get("matched")
        trim = not seq.params.no_stop_trim and reason.get("type") == "stop"
        if trim and isinstance(matched, int) and ids and ids[-1] == matched:
            ids = ids[:-1]
        if trim and isinstance(matched, str):
            return seq.text[:seq.stop_pos]
        return self.decode(ids, seq)
