"""A request's response dict (SGLang's `/generate` shape): text, output ids and `meta_info` with
finish reason, usage, weight version, compression counters and the requested log-probs."""

from __future__ import annotations

import itertools
import time

from .detokenizer import Detokenizer
from .sequence import Sequence


class OutputBuilder:
    """Formats a request's state as SGLang's response dict; holds the weight version the responses
    report (set by weight updates, read between steps on the engine thread)."""

    def __init__(self, tokenizer, detok: Detokenizer, compressor, weight_version: str):
        self.tokenizer, self.detok, self.compressor = tokenizer, detok, compressor
        self.weight_version = weight_version

    def build(self, seq: Sequence, final: bool) -> dict:
        meta = self._meta(seq, final)
        if seq.return_logprob:
            meta.update(self._logprobs(seq))
        if final and seq.eviction is not None:  # a CPU tensor; the HTTP layer encodes it
            meta["eviction_record"] = seq.eviction.finish(seq.num_tokens)
            meta["eviction_record_exact"] = seq.eviction.exact
            meta["eviction_record_dense_from"] = seq.eviction.dense_from
        return {"text": self._text(seq, final), "output_ids": list(seq.output_ids), "meta_info": meta}

    def _text(self, seq: Sequence, final: bool) -> str:
        if self.tokenizer is None:
            return ""
        text = self.detok.final_text(seq) if final else seq.text
        if not final and seq.params.stop:
            # Hold back what could be the start of a stop string, so streamed text never
            # shows characters the final (trimmed) text drops.
            hold = max(len(s) for s in seq.params.stop) - 1
            text = text[:max(0, len(text) - hold)]
        return text

    def _meta(self, seq: Sequence, final: bool) -> dict:
        meta = {
            "id": seq.rid,
            "finish_reason": seq.finish_reason if final else None,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": seq.cached_tokens,
            "weight_version": self.weight_version,
            "e2e_latency": (seq.finished_at or time.time()) - seq.created,
            "num_preemptions": seq.num_preemptions,
        }
        if seq.session_id is not None:  # the whole context before this request's output
            meta["session_context_len"] = len(seq.prompt_ids)
        if self.compressor is not None:
            meta["compression"] = {
                "num_compressions": seq.num_compressions, "tokens_evicted": seq.tokens_evicted,
                "peak_kv_slots": max(seq.peak_kv, seq.kv_len),
                "stopped_after_think": seq.compress_stopped,
                # what this request ran with: dense (`compress: false`), else its budget B
                "dense": not seq.compress,
                "budget": self.compressor.trigger.budget(seq) if seq.compress else None}
        return meta

    def _token_text(self, seq: Sequence, tid: int):
        if not seq.return_text_in_logprobs or self.tokenizer is None:
            return None
        return self.tokenizer.decode([tid])

    def _logprobs(self, seq: Sequence) -> dict:
        tt = lambda t: self._token_text(seq, t)  # noqa: E731
        # (log-prob, id, text) tuples, not lists: a tuple of a float, an int and None or a str
        # leaves the garbage collector's tracking at its first pass, a list never does. A 4k
        # rollout holds ~1M of them until the trainer has read them; as lists every full
        # collection walked them all (~0.2 s each on a slow host, several a rollout).
        if seq.return_text_in_logprobs and self.tokenizer is not None:
            out = [(lp, t, tt(t)) for lp, t in zip(seq.output_logprobs, seq.output_ids)]
        else:  # no text: no call per token (256 x 512 of them end a rollout's last step)
            out = list(zip(seq.output_logprobs, seq.output_ids, itertools.repeat(None)))
        meta = {"output_token_logprobs": out}
        if seq.logprob_start_len >= 0 and seq.input_logprobs is not None:
            start = seq.logprob_start_len
            meta["input_token_logprobs"] = [
                [lp, t, tt(t)] for lp, t in zip(seq.input_logprobs, seq.prompt_ids[start:])]
        if seq.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[lp, t, tt(t)] for lp, t in top] for top in seq.output_top_logprobs]
            if seq.input_top_logprobs is not None:
                meta["input_top_logprobs"] = [
                    None if top is None else [[lp, t, tt(t)] for lp, t in top]
                    for top in seq.input_top_logprobs]
        return meta
