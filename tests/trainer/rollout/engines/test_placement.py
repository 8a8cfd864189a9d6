"""Which ranks host a colocated engine: every GPU by default (TP > 1 included: each tensor-
parallel rank holds the full gathered weights, so no GPU idles while the rollout runs), one per
data-parallel replica on request or with pipeline parallelism; rank 0 alone for servers."""

from __future__ import annotations

import pytest
from megatron.core import parallel_state as ps

from trainer.rollout.engines import sharding


@pytest.fixture
def grid(monkeypatch):
    """Rank 3 of 4 = TP 2 x DP 2 (tensor rank 1 of data-parallel replica 1), pipeline 1."""
    def set_grid(rank=3, world=4, tp_rank=1, dp_rank=1, dp_world=2, pp_world=1):
        monkeypatch.setattr(sharding.dist, "is_initialized", lambda: True)
        monkeypatch.setattr(sharding.dist, "get_rank", lambda: rank)
        monkeypatch.setattr(sharding.dist, "get_world_size", lambda: world)
        monkeypatch.setattr(ps, "get_tensor_model_parallel_rank", lambda: tp_rank)
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_rank", lambda: 0)
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: pp_world)
        monkeypatch.setattr(ps, "get_data_parallel_rank", lambda: dp_rank)
        monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda: dp_world)
    return set_grid


def test_every_gpu_hosts_an_engine_at_tp2(grid):
    grid()
    assert sharding.placement(remote=False) == sharding.Placement(4, 3)


def test_per_replica_leaves_second_tensor_rank_idle(grid):
    grid()
    assert not sharding.placement(remote=False, per_gpu=False).generates
    grid(rank=2, tp_rank=0)
    assert sharding.placement(remote=False, per_gpu=False) == sharding.Placement(2, 1)


def test_pipeline_parallel_keeps_one_engine_per_replica(grid):
    grid(rank=2, tp_rank=0, pp_world=2)
    assert sharding.placement(remote=False) == sharding.Placement(2, 1)


def test_servers_are_driven_by_rank_zero(grid):
    grid()
    assert sharding.placement(remote=True) == sharding.Placement(1, None)
    grid(rank=0, tp_rank=0, dp_rank=0)
    assert sharding.placement(remote=True) == sharding.Placement(1, 0)
