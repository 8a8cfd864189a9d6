"""benchmarks/engine/compaction.py on a CPU at a tiny shape: the timed compress() compacts every
request of the round to its budget (hand-computed: kv_len B, one compaction, n - B slots freed to
the pool) and times each stage; the script's main runs end to end."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from benchmarks.engine import compaction


def _args(**kw):
    base = dict(requests=4, budget=24, divide_length=8, layers=2, kv_heads=2, heads=4,
                head_dim=16, repeats=1, warmup=0, algorithms="rkv,snapkv,streamingllm")
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("algo", ["rkv", "snapkv", "streamingllm"])
def test_a_timed_round_compacts_every_request_to_its_budget(algo):
    args = _args()
    comp, kv, n = compaction.make_round(args, algo, torch.device("cpu"))
    seqs = compaction.fresh_seqs(kv, args.requests, n)
    free_before = kv.num_free
    timer = compaction.StageTimer(torch.device("cpu"))
    compaction.timed_compress(comp, seqs, timer)
    assert [s.kv_len for s in seqs] == [args.budget] * args.requests
    assert [s.num_compressions for s in seqs] == [1] * args.requests
    assert kv.num_free - free_before == args.requests * (n - args.budget)


def test_records_hold_each_requests_evictions():
    """--eviction-record: after the round, every request's record marks n - B keys per layer and
    KV head as gone from query n on (hand-computed), the other B never."""
    args = _args(eviction_record=True)
    comp, kv, n = compaction.make_round(args, "rkv", torch.device("cpu"))
    seqs = compaction.fresh_seqs(kv, args.requests, n, records=True)
    compaction.timed_compress(comp, seqs, compaction.StageTimer(torch.device("cpu")))
    for s in seqs:
        record = s.eviction.finish(n + 1)  # length n + 1: never-evicted keys hold n + 1
        assert ((record == n).sum(-1) == n - args.budget).all()
        assert ((record == n + 1).sum(-1) == args.budget + 1).all()


def test_main_runs_at_a_tiny_shape(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["compaction", "--requests", "4", "--budget", "24",
                                      "--divide-length", "8", "--layers", "2", "--heads", "4",
                                      "--head-dim", "16", "--repeats", "1", "--warmup", "0"])
    compaction.main()
    out = capsys.readouterr().out
    for algo in ("rkv", "snapkv", "streamingllm"):
        assert f"| {algo} | total |" in out
