"""DAPO's soft over-long penalty and over-long filtering against hand-computed values."""

import pytest
import torch

from trainer.algorithms.overlong import OverlongConfig, keep_rows, overlong_penalty


def test_penalty_is_linear_in_the_buffer_and_capped():
    # L = 20, B = 8: free up to 12 tokens, then -(l - 12) / 8 * 0.5, at most -0.5
    cfg = OverlongConfig(buffer_len=8, penalty_factor=0.5)
    out = overlong_penalty(torch.tensor([5, 12, 13, 16, 20, 25]), 20, cfg)
    assert out.tolist() == [0.0, 0.0, -0.0625, -0.25, -0.5, -0.5]


def test_penalty_off_without_a_buffer():
    out = overlong_penalty(torch.tensor([1, 20]), 20, OverlongConfig(buffer_len=0))
    assert out.tolist() == [0.0, 0.0]


def test_filtering_keeps_the_finished_rows_only():
    assert keep_rows([False, True, False], OverlongConfig(filtering=True)).tolist() == \
        [True, False, True]
    assert keep_rows([False, True], OverlongConfig(filtering=False)) is None
    assert keep_rows([False, False], OverlongConfig(filtering=True)) is None


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="buffer_len"):
        OverlongConfig(buffer_len=-1)
