"""When a request ends after the token it just got: its length limit, a stop id (found on the
GPU), the context length, or a stop string (found in the incrementally decoded text)."""

from __future__ import annotations

from .detokenizer import Detokenizer
from .sequence import Sequence


def check_finish(seq: Sequence, tok: int, is_stop_id: bool, max_seq_len: int,
                 detok: Detokenizer) -> dict | None:
    """`is_stop_id`: the GPU found `tok` among the request's stop ids (row_state.py)."""
    p, n = seq.params, len(seq.output_ids)
    if n >= p.max_new_tokens:
        return {"type": "length", "length": p.max_new_tokens}
    if is_stop_id and n > p.min_new_tokens:  # stop ids were masked out below min_new_tokens
        return {"type": "stop", "matched": tok}
    if seq.num_tokens >= max_seq_len:
        return {"type": "length", "length": n}
    if p.stop and detok.tokenizer is not None:
        delta = detok.update(seq)
        if n >= p.min_new_tokens:
            hit = detok.find_stop(seq, delta)
            if hit is not None:
                seq.stop_pos = hit[1]
                return {"type": "stop", "matched": hit[0]}
    return None


def abort_reason(message: str) -> dict:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def error_reason(message: str, e: BaseException) -> dict:
    """finish_reason of a request ended by an engine failure (HTTP 500 to the client)."""
    return {"type": "abort", "message": message, "status_code": 500, "err_type": type(e).__name__}
