"""The filtered draw's top-k path (SamplingBatch.k_max) against the full-vocabulary sort: the
same tokens for the same seeds, ties included, whatever k_max the batch sets."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.sampler import Sampler, SamplingBatch

V = 1000
# (temperature, top_p, top_k or None, min_p): top-k only, top-k + top-p, top-p only, min-p,
# greedy, unfiltered
ROWS = [(1.0, 1.0, 5, 0.0), (0.8, 0.9, 40, 0.0), (1.0, 0.7, None, 0.0), (1.2, 1.0, None, 0.05),
        (0.0, 1.0, 7, 0.0), (1.0, 1.0, None, 0.0), (0.7, 0.95, 1, 0.0), (1.0, 0.5, 64, 0.1)]


def _batch(rows: list, step: int, k_max: int | None, first: int = 0) -> SamplingBatch:
    t, p, k, m = (list(c) for c in zip(*rows))
    filtered = torch.tensor([x > 0 and (pp < 1 or kk is not None or mm > 0)
                             for x, pp, kk, mm in rows])
    temps = torch.tensor(t, dtype=torch.float32)
    return SamplingBatch(
        temperatures=temps, top_p=torch.tensor(p), min_p=torch.tensor(m),
        top_k=torch.tensor([kk or V for kk in k]), seeds=torch.arange(first, first + len(rows)) * 7919 + 11,
        steps=torch.full((len(rows),), step), all_greedy=False, need_filter=True,
        need_logprobs=True, top_logprobs_num=0, filtered=filtered, k_max=k_max)


def _draws(logits: torch.Tensor, rows: list, step: int, k_max: int | None,
           first: int = 0) -> torch.Tensor:
    """The batch's tokens; row i draws with seed number first + i."""
    return Sampler()(logits.clone(), _batch(rows, step, k_max, first)).ids


def _coarse(logits: torch.Tensor) -> torch.Tensor:
    """Logits on a grid of 0.25: many exact ties, also at the k-th value (as bf16 logits)."""
    return (logits * 4).round() / 4


def test_top_k_path_draws_the_full_sort_tokens():
    """Only rows with a top_k may take the top-k path (the engine sets k_max then); their
    tokens, and everyone else's, equal the full sort's for the same seeds."""
    torch.manual_seed(0)
    with_k = [r for r in ROWS if r[2] is not None or r[0] == 0 or r[1:] == (1.0, None, 0.0)]
    for step in range(40):
        logits = torch.randn(len(with_k), V) * 3
        if step % 2:
            logits = _coarse(logits)
        want = _draws(logits, with_k, step, None)
        assert torch.equal(_draws(logits, with_k, step, 64), want), step
        assert torch.equal(_draws(logits, with_k, step, 100), want), step  # k_max above the top_k


def test_mixed_rows_without_top_k_keep_the_full_sort():
    """A batch with a top-p-only or min-p-only row gets no k_max: the full sort, as before."""
    torch.manual_seed(1)
    logits = torch.randn(len(ROWS), V) * 3
    got = _draws(logits, ROWS, 3, None)
    for i, row in enumerate(ROWS):  # each row alone: the same token (batch-independent)
        assert _draws(logits[i:i + 1], [row], 3, None, first=i)[0] == got[i]


def test_a_row_draws_the_same_token_whatever_k_max():
    """k_max comes from batch-mates: a row's token must not depend on it, ties included."""
    torch.manual_seed(2)
    row = (1.0, 0.9, 5, 0.0)
    for step in range(60):
        logits = _coarse(torch.randn(1, V) * 2)
        alone = _draws(logits, [row], step, 5)
        for k_max in (6, 17, 256):
            assert _draws(logits, [row], step, k_max)[0] == alone[0], (step, k_max)


def test_ties_at_the_kth_value_go_to_the_lowest_ids():
    """Hand-computed: all logits equal, top_k 3: only ids 0, 1, 2 are ever drawn, each about a
    third of the time, by both paths."""
    row = (1.0, 1.0, 3, 0.0)
    logits = torch.zeros(1, V)
    for k_max in (None, 3, 10):
        ids = torch.stack([_draws(logits, [row], s, k_max)[0] for s in range(300)])
        assert set(ids.tolist()) == {0, 1, 2}
        assert torch.bincount(ids).min() > 60


def test_zero_probability_tail_inside_k_max():
    """Banned tokens (-inf) leave fewer positive probabilities than k_max: only the allowed
    tokens are drawn, the same by both paths."""
    torch.manual_seed(3)
    logits = torch.full((1, V), float("-inf"))
    logits[0, [10, 500, 999]] = torch.tensor([0.5, 0.1, 0.2])
    row = (1.0, 1.0, 20, 0.0)
    for step in range(100):
        want = _draws(logits, [row], step, None)
        assert want[0] in (10, 500, 999)
        assert _draws(logits, [row], step, 32)[0] == want[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_top_k_path_on_cuda_with_bf16_logits():
    """On the GPU (its topk, sort and scan kernels), bf16 logits at Qwen's vocabulary size: the
    same tokens as the full sort, and the same whatever k_max."""
    torch.manual_seed(4)
    rows = [(0.7, 0.8, 20, 0.0), (1.0, 1.0, 5, 0.0), (1.0, 0.9, 50, 0.02), (0.0, 1.0, 20, 0.0)] * 16
    for step in range(20):
        logits = (torch.randn(len(rows), 151936, device="cuda") * 4).bfloat16()
        sb = [_batch(rows, step, k) for k in (None, 64, 256)]
        for b in sb:
            for name in ("temperatures", "top_p", "min_p", "top_k", "seeds", "steps", "filtered"):
                setattr(b, name, getattr(b, name).cuda())
        want = Sampler()(logits.clone(), sb[0]).ids
        for b in sb[1:]:
            assert torch.equal(Sampler()(logits.clone(), b).ids, want), (step, b.k_max)
