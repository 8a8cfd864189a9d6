"""engine/output.py's response dict: the output log-prob entries hold what the previous lists
held, value for value and as JSON (the HTTP body), and they leave the garbage collector's
tracking (a 4k rollout holds ~1M of them: as lists every full collection walked them)."""

from __future__ import annotations

import gc
import json
import random

from sglang_kvc.engine.detokenizer import Detokenizer
from sglang_kvc.engine.output import OutputBuilder
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence


class ByteTokenizer:
    def decode(self, ids, **kw):
        return "".join(chr(97 + i % 26) for i in ids)


def finished_seq(n: int, text: bool = False) -> Sequence:
    rng = random.Random(n)
    seq = Sequence("r", [5, 6, 7], SamplingParams.from_dict({"max_new_tokens": n}), seed=1,
                   return_logprob=True, return_text_in_logprobs=text)
    seq.output_ids = [rng.randrange(151936) for _ in range(n)]
    seq.output_logprobs = [-rng.random() * 12 for _ in range(n)]
    seq.finish_reason = {"type": "length", "length": n}
    return seq


def previous(seq: Sequence, text) -> list:
    """What the builder returned before (lists)."""
    return [[lp, t, text(t)] for lp, t in zip(seq.output_logprobs, seq.output_ids)]


def test_output_logprobs_hold_the_previous_values_and_json():
    seq = finished_seq(4096)
    meta = OutputBuilder(None, Detokenizer(None), None, "v0").build(seq, final=True)["meta_info"]
    got, before = meta["output_token_logprobs"], previous(seq, lambda t: None)
    assert [list(e) for e in got] == before
    assert json.dumps(got) == json.dumps(before)  # the HTTP body is unchanged
    assert [e[1] for e in got] == seq.output_ids and [e[0] for e in got] == seq.output_logprobs


def test_output_logprobs_with_token_text():
    tok = ByteTokenizer()
    seq = finished_seq(50, text=True)
    meta = OutputBuilder(tok, Detokenizer(tok), None, "v0").build(seq, final=True)["meta_info"]
    assert [list(e) for e in meta["output_token_logprobs"]] == previous(seq, lambda t: tok.decode([t]))


def test_output_logprobs_leave_gc_tracking():
    seq = finished_seq(1000)
    got = OutputBuilder(None, Detokenizer(None), None, "v0").build(seq, final=True)["meta_info"][
        "output_token_logprobs"]
    lists = previous(seq, lambda t: None)
    gc.collect()
    assert not any(gc.is_tracked(e) for e in got)
    assert all(gc.is_tracked(e) for e in lists)  # what the previous lists cost every collection
