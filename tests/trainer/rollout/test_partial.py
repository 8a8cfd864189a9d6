"""Partial rollouts: interrupted samples continue under the new weights, each exactly once, with
per-token behaviour log-probs and versions; the sparse/decoupled correction reads them per token."""

from __future__ import annotations

import math
import threading

import torch

from trainer.algorithms import correction_preset, compute_mis_weights
from trainer.rollout.async_rollout import AsyncRollouts, WeightGate
from trainer.rollout.engines.interface import Backend, Generation, RolloutConfig, sample_requests
from trainer.rollout.partial import ResumableBackend, join
from trainer.rollout.samples.staleness import check_bound, staleness, staleness_metrics, token_versions


class InterruptibleBackend(Backend):
    """A fake engine: sample k of the first call is aborted after k tokens when a push is under
    way; every token's log-prob encodes the version that sampled it (-0.1 x (version + 1))."""

    def __init__(self, gate_holder):
        self.gate_holder, self.calls, self.version = gate_holder, [], 0
        self.in_flight = threading.Event()  # the first call is on the engine: a push interrupts it

    def run(self, requests, cfg):
        self.calls.append(requests)
        first = len(self.calls) == 1
        if first:
            self.in_flight.set()
            self.gate_holder["pushing"].wait(30)
        out = []
        for k, r in enumerate(requests):
            limit = r.sampling_params["max_new_tokens"]  # as the real backends
            stop = k if first and k < limit else limit
            toks = [100 + len(r.input_ids) + t for t in range(stop)]
            lp = [-0.1 * (self.version + 1)] * stop
            finish = "abort" if first and stop < limit else "length"
            out.append(Generation(toks, lp, "x" * stop, finish, f"rollout-{self.version}",
                                  {"prompt_tokens": len(r.input_ids)}))
        return out


def test_interrupted_samples_resume_once_under_the_new_version():
    holder = {"pushing": threading.Event()}
    inner = InterruptibleBackend(holder)
    gate = WeightGate(0, 1, interrupt=holder["pushing"].set)
    backend = ResumableBackend(inner, gate)
    cfg = RolloutConfig(max_response_len=4, seed=10)
    producer = AsyncRollouts(lambda r: backend.generate([[1, 2], [3]], 2, cfg), gate,
                             range(1)).start()
    assert inner.in_flight.wait(30)
    with gate.update(1):
        inner.version = 1  # the push: the engine now serves rollout-1
    gens = producer.get(0)
    producer.close()
    assert len(gens) == 4 and all(len(g.response_ids) == 4 for g in gens)  # each completed once
    # sample k had k tokens when interrupted: k tokens of version 0, then 4 - k of version 1
    for k, g in enumerate(gens):
        assert token_versions(g, 0) == [0] * k + [1] * (4 - k)
        assert g.logprobs == [-0.1] * k + [-0.2] * (4 - k)
        assert g.finish_reason == "length" and g.weight_version == "rollout-1"
    # continuations, all in one batch: prompt + generated tokens, for the tokens left, with
    # fresh seeds (sample 3 had 3 of 4 tokens; sample 0 none, still resumed)
    assert len(inner.calls) == 2
    resumed = inner.calls[1]
    # (token t of a prompt of length L is 100 + L + t)
    assert [r.input_ids for r in resumed] == [[1, 2], [1, 2, 102], [3, 101, 102], [3, 101, 102, 103]]
    assert [r.sampling_params["max_new_tokens"] for r in resumed] == [4, 3, 2, 1]
    first_seeds = [r.sampling_params["sampling_seed"] for r in inner.calls[0]]
    assert first_seeds == [10, 11, 12, 13]
    seeds = [r.sampling_params["sampling_seed"] for r in resumed]
    assert len(set(seeds) | set(first_seeds)) == 8
    assert gate.interruptions == 1
    lags = staleness(gens, 1, 0)
    assert lags == [1, 1, 1, 1]  # all started under version 0 (sample 0 before its first token)
    check_bound(lags, 1, 1)
    assert staleness_metrics(gens, lags, 0)["rollout/partial_samples"] == 3.0


def test_a_plug_ins_own_token_budget_holds_across_an_interruption():
    """A generate plug-in sends ``max_new_tokens`` per request (long-tail lengths, recipes): a
    resumed sample gets what is left of *that* budget, not the whole of it again."""
    holder = {"pushing": threading.Event()}
    inner = InterruptibleBackend(holder)
    gate = WeightGate(0, 1, interrupt=holder["pushing"].set)
    backend = ResumableBackend(inner, gate)
    cfg = RolloutConfig(max_response_len=10, seed=3)
    producer = AsyncRollouts(lambda r: backend.generate([[1], [2]], 2, cfg, max_new_tokens=3),
                             gate, range(1)).start()
    assert inner.in_flight.wait(30)
    with gate.update(1):
        inner.version = 1
    gens = producer.get(0)
    producer.close()
    # sample k stopped after k tokens (k < 3), then got 3 - k more; sample 3 was never cut
    assert [len(g.response_ids) for g in gens] == [3, 3, 3, 3]
    assert [token_versions(g, 0) for g in gens[:3]] == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert [r.sampling_params["max_new_tokens"] for r in inner.calls[1]] == [3, 2, 1]


def test_without_a_push_an_abort_stays_an_abort():
    gate = WeightGate(0, 1)
    g = Generation([5], [-1.0], "a", "abort", "rollout-0", {})

    class Once(Backend):
        def run(self, requests, cfg):
            return [g]

    assert ResumableBackend(Once(), gate).generate([[1]], 1, RolloutConfig(max_response_len=4)) == [g]


def test_staleness_beyond_the_bound_is_an_error():
    g = Generation([1, 2], [0.0, 0.0], "", "stop", "rollout-1", {})
    try:
        check_bound(staleness([g], 3, 0), 1, 3)
    except RuntimeError as e:
        assert "lags 2 weight versions, beyond --max-staleness 1" in str(e)
    else:
        raise AssertionError("the bound was not enforced")


def test_two_version_sample_ratios_by_hand():
    """A sample whose first 2 tokens came from version 0 and last 2 from version 1: the
    correction's token ratios are π_old / π_behaviour with each token's own behaviour."""
    head = Generation([7, 8], [math.log(0.5), math.log(0.25)], "", "abort", "rollout-0", {})
    tail = Generation([9, 10], [math.log(0.8), math.log(0.4)], "", "stop", "rollout-1", {})
    g = join(head, tail, 0)
    assert token_versions(g, 0) == [0, 0, 1, 1]
    behaviour = torch.tensor([g.logprobs])
    old = torch.log(torch.tensor([[0.6, 0.25, 0.6, 0.5]]))  # the trainer's π_old recompute
    cfg = correction_preset("decoupled_token_is", upper_bound=10.0)
    mis = compute_mis_weights(old, behaviour, torch.ones(1, 4, dtype=torch.bool), cfg)
    assert torch.allclose(mis.weights, torch.tensor([[1.2, 1.0, 0.75, 1.25]]), atol=1e-6)


def test_a_submitted_request_resumes_as_a_batched_one():
    """``submit`` (an episode's turn) goes through the same resume: interrupted at the push, it
    comes back whole, its later tokens from the new weights; sessions are the engine's."""
    holder = {"pushing": threading.Event()}
    inner = InterruptibleBackend(holder)
    gate = WeightGate(0, 1, interrupt=holder["pushing"].set)
    backend = ResumableBackend(inner, gate)
    assert backend.has_sessions is inner.has_sessions is False
    cfg = RolloutConfig(max_response_len=4, seed=5)
    (request,) = sample_requests([[1, 2]], 1, cfg)
    producer = AsyncRollouts(lambda r: [backend.submit(request, cfg).result()], gate,
                             range(1)).start()
    assert inner.in_flight.wait(30)
    with gate.update(1):
        inner.version = 1
    (gen,) = producer.get(0)
    producer.close()
    # sample 0 of the first call is cut before its first token, then resumed whole
    assert len(gen.response_ids) == 4 and token_versions(gen, 0) == [1, 1, 1, 1]
    assert len(inner.calls) == 2 and inner.calls[1][0].input_ids == [1, 2]
