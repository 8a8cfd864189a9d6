"""benchmarks/training/sparse_recompute.py on a CPU with a tiny shape (numbers printed, never asserted), and
its synthetic records hold the kept-set sizes R-KV would."""

from __future__ import annotations

import pytest
import torch

from .test_rl_step_and_train_step import _load, _run


@pytest.mark.launch
def test_bench_sparse_recompute_tiny_on_cpu():
    result, stdout = _run("training.sparse_recompute", "--shape", "tiny", "--response-len", "200",
                          "--budget", "32", "--divide-length", "8", "--seqs-per-step", "3",
                          "--max-tokens-per-gpu", "512", "--steps", "1", "--vary-lengths",
                          "--sparse-impl", "auto", "mask", timeout=300)
    for key in ("dense_recompute_tokens_per_s", "sparse_recompute_tokens_per_s",
                "dense_update_tokens_per_s", "sparse_update_tokens_per_s",
                "dense_rollout_tokens_per_s", "sparse_rollout_tokens_per_s",
                "recompute_time_ratio", "update_time_ratio", "rollout_time_ratio"):
        assert result[key] > 0, key
    build = result["mask_build_ms"]
    assert build["cold"] > 0 and 0 < build["min"] <= build["median"] <= build["max"]
    assert build["tiles_median"] > 0 and result["compiled_graphs_timed"] >= 0
    assert "update_time_ratio" in stdout
    # a second replay attention is timed beside the first, under its own name
    assert result["sparse_mask_update_tokens_per_s"] > 0 and result["mask_update_time_ratio"] > 0
    # no attention computes fewer tiles than the pairs attended fill, and flex never more than
    # dense causal (its tiles are dense's, some of them skipped)
    tiles = result["tile_work"]
    assert tiles["pairs_per_tile_area"] <= tiles["flex"]["total"] <= tiles["dense"]["total"]

def test_synthetic_records_keep_budget_plus_growth():
    bench = _load("training.sparse_recompute")
    P, n, B, N, w = 10, 120, 24, 6, 4
    rec = bench.rkv_like_record(2, 3, P, n, B, N, w, torch.Generator().manual_seed(0)).long()
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    seen = ((k <= q) & (q < rec[..., None, :])).sum(-1)  # [L, H, n] keys each query sees
    assert (seen[..., :P] == torch.arange(1, P + 1)).all()
    assert seen[..., P:].max() <= B + N and seen[..., P:].min() >= min(P + 1, B + 1)
    assert (seen[..., P:] == B + 1).any()  # right after each compaction
    assert (rec[0, 0] != rec[1, 2]).any()  # kept sets differ per layer and head

