"""The device's peak memory per rollout, this rank's and the job's fullest GPU's."""

from __future__ import annotations

def _read_peaks(torch) -> list[float]:
    """This process's device peaks since the last call, then reset: each rollout its own peak."""
    gib = float(1 << 30)
    peaks = [torch.cuda.max_memory_allocated() / gib, torch.cuda.max_memory_reserved() / gib]
    torch.cuda.reset_peak_memory_stats()
    return peaks


def _max_over_ranks(torch, peaks: list[float]) -> list[float]:
    """Two floats in one all-reduce: the fullest GPU of the job (any rank may be the one OOMing)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return peaks
    t = torch.tensor(peaks, dtype=torch.float64, device=torch.cuda.current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def peak_memory_metrics() -> dict:
    """Collective on CUDA (every rank calls it once per rollout): this rank's peaks (rank 0's in
    the log) and the max over ranks, in GiB; {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    mine = _read_peaks(torch)
    top = _max_over_ranks(torch, mine)
    return {"memory/peak_allocated_gib": mine[0], "memory/peak_reserved_gib": mine[1],
            "memory/peak_allocated_gib_max": top[0], "memory/peak_reserved_gib_max": top[1]}
