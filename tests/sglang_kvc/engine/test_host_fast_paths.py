"""The engine thread's per-step shortcuts at big batches, each against the general path it
stands for: the lean pass that hands a decode step's tokens to its requests (token_intake.py),
the step integers advanced by one add (step_ints.py), and the decode graphs kept over weight
updates and KV-pool moves (cuda_graph.DecodeGraphs.follow_pool), with captures emulated on the
CPU as in test_graph_step_logic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence
from sglang_kvc.engine.step_ints import StepInts, read_step_ints
from sglang_kvc.engine.step_loop import StepLoop

from .test_graph_step_logic import EmulatedGraphs
from .test_overlap import assert_same, make, request_mix, run_mix

RKV = {"compress_algorithm": "rkv", "compress_max_prompt": 12, "compress_divide_length": 4,
       "compress_max_window": 3}


@pytest.mark.parametrize("extra", [{}, RKV], ids=["dense", "rkv"])
def test_lean_token_pass_equals_the_general_path(tiny_models, extra, monkeypatch):
    """Every way a request ends (length, stop id, stop id under min_new_tokens, stop string,
    EOS, max_new_tokens 0 or 1, log-probs and top log-probs), batched together: the outputs of
    the lean pass equal those of the per-request path (tokens, text and finish exactly)."""
    with make(tiny_models, overlap=True, **extra) as eng:
        mix = request_mix(eng)
        got = run_mix(eng, mix)
        assert eng.loop._plan is not None  # the lean pass really ran
    monkeypatch.setattr(StepLoop, "_process", StepLoop._process_each)
    with make(tiny_models, overlap=True, **extra) as eng:
        want = run_mix(eng, mix)
    assert_same(got, want, tol=1e-5)  # (batches form as requests arrive: fp32 rounding)


def _plain_mix(eng) -> list:
    """Requests that need nothing but their tokens (an RL rollout's): stop ids that fire, EOS,
    length limits of 1 to 24, log-probs on some; the whole batch takes the column-wise pass."""
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12, 3)]
    greedy = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    stop_tok = eng.generate(input_ids=ids[0], sampling_params=greedy)["output_ids"][5]
    seeded = {"temperature": 1.0, "max_new_tokens": 20, "sampling_seed": 3, "ignore_eos": True}
    lp = {"return_logprob": True}
    return [(ids[0], greedy, lp), (ids[0], dict(greedy, stop_token_ids=[stop_tok]), lp),
            (ids[1], dict(seeded, n=3), lp), (ids[2], dict(greedy, max_new_tokens=1), lp),
            (ids[3], {"temperature": 0.7, "max_new_tokens": 30, "sampling_seed": 11}, lp),
            (ids[4], dict(greedy, stop_token_ids=[stop_tok], min_new_tokens=7), lp),
            (ids[5], dict(seeded, max_new_tokens=13), lp)]


def test_column_pass_equals_the_general_path(tiny_models, monkeypatch):
    from sglang_kvc.engine import token_intake

    calls = []
    column = token_intake._append_columns
    monkeypatch.setattr(token_intake, "_append_columns", lambda *a: calls.append(1) or column(*a))
    with make(tiny_models, overlap=True) as eng:
        mix = _plain_mix(eng)
        got = run_mix(eng, mix)
    assert calls  # the column-wise pass really ran
    monkeypatch.setattr(StepLoop, "_process", StepLoop._process_each)
    with make(tiny_models, overlap=True) as eng:
        want = run_mix(eng, mix)
    assert_same(got, want, tol=1e-5)
    assert {w["meta_info"]["finish_reason"]["type"] for w in want} == {"stop", "length"}


def _seqs(n: int) -> list[Sequence]:
    out = []
    for i in range(n):
        s = Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_new_tokens=64), seed=i)
        s.row, s.kv_len, s.num_computed, s.num_sampled = i + 1, 10 + i, 20 + i, i
        out.append(s)
    return out


def _advance(seqs: list[Sequence]) -> None:  # what a graphed step does to its requests
    for s in seqs:
        s.kv_len += 1
        s.num_computed += 1
        s.num_sampled += 1


def test_step_ints_advanced_by_one_add_equal_the_requests_values():
    seqs, ints, bt = _seqs(5), StepInts(), object()
    for _ in range(4):
        assert np.array_equal(ints.next(seqs, bt, 8), read_step_ints(seqs, 8))
        _advance(seqs)
    seqs[2].kv_len -= 7  # a compaction: the runner forgets, the next step reads the requests
    ints.forget()
    assert np.array_equal(ints.next(seqs, bt, 8), read_step_ints(seqs, 8))
    other = seqs[:4]  # another batch (its own object): read again, not advanced
    assert np.array_equal(ints.next(other, object(), 4), read_step_ints(other, 4))
    assert read_step_ints(seqs[:1], 2).tolist() == [24, 0, 15, 1, 4, 0, 1, 0]  # padding (0, 1, 0, 0)


class CountedGraphs(EmulatedGraphs):
    def _capture(self, gbs, mode):
        super()._capture(gbs, mode)
        self.num_captures += 1


def _emulated(eng) -> CountedGraphs:
    graphs = eng.runner.graphs = CountedGraphs(eng.runner.graph_parts(), 16)
    return graphs


def test_weight_updates_and_kv_release_keep_the_graphs(tiny_models):
    """A rollout-by-rollout loop (weights updated in place, the KV pool released and resumed
    at the same address) captures each graph once per engine life."""
    params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    ids = [[5, 6, 7, 8], [9, 10, 11]]
    with make(tiny_models, overlap=True, cuda_graph_max_bs=16) as eng:
        graphs = _emulated(eng)
        first = eng.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        captures = graphs.num_captures
        named = [(n, p.detach().clone()) for n, p in eng.runner.model.named_parameters()]
        for _ in range(2):
            eng.update_weights_from_tensor(named_tensors=named)
            eng.release_memory(["kv_cache"])
            eng.resume_memory(["kv_cache"])
            again = eng.generate(input_ids=ids, sampling_params=params, return_logprob=True)
            assert [a["output_ids"] for a in again] == [f["output_ids"] for f in first]
        info = eng.get_server_info()["cuda_graphs"]
    assert captures > 0 and info["captures"] == captures * info["pool_addresses"]


def test_a_pool_back_at_an_old_address_replays_its_graphs(tiny_models):
    """Graphs are kept per KV-pool address (the last KEEP_POOL_ADDRESSES): a pool that comes
    back where it was before replays them, a new address captures its own, the oldest go."""
    from sglang_kvc.engine.cuda_graph import KEEP_POOL_ADDRESSES

    params = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
    with make(tiny_models, overlap=True, cuda_graph_max_bs=16) as eng:
        graphs = _emulated(eng)
        at = ["A"]
        graphs._pool_ptrs = lambda: (at[0], at[0])

        def run_at(address: str) -> int:
            at[0] = address
            eng.loop.call(graphs.follow_pool)
            eng.generate(input_ids=[[5, 6, 7]], sampling_params=params)
            return graphs.num_captures

        per_address = run_at("A")
        assert run_at("B") == 2 * per_address and run_at("A") == 2 * per_address
        for k in range(KEEP_POOL_ADDRESSES):  # A is the oldest kept, then dropped
            run_at(f"C{k}")
        assert run_at("A") == (3 + KEEP_POOL_ADDRESSES) * per_address
        assert len(graphs.by_pool) == KEEP_POOL_ADDRESSES
