"""Which ranks generate, which prompts each one takes, and how the shards come back together.

Colocated rollouts: one engine per GPU (``per_gpu``, the default): every rank hosts one, with
the full weights its tensor-parallel group gathers for the weight push anyway, so with
``--tensor-model-parallel-size 2`` every GPU still generates. ``--rollout-engine-placement
per-replica`` (or pipeline parallelism) keeps one per data-parallel replica, on its first
tensor-parallel rank (half the engine weights' memory at TP = 2, half the generating GPUs).
Remote servers: global rank 0 alone talks to them. Prompts are split into contiguous, balanced shards in engine order,
and the gathered samples are concatenated in that order: the global batch is the one a single
engine would have produced, sample for sample (each sample's seed is its global index).
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class Placement:
    num_generators: int  # engines (or 1 for remote servers)
    index: int | None  # this rank's generator index; None when this rank does not generate
    group: object = None  # the process group of the gather (async: not the training thread's)

    @property
    def generates(self) -> bool:
        return self.index is not None


def placement(remote: bool, per_gpu: bool = True) -> Placement:
    """This rank's role in generation (Megatron's parallel state must be initialised)."""
    from megatron.core import parallel_state as ps

    rank = dist.get_rank() if dist.is_initialized() else 0
    if remote:
        return Placement(1, 0 if rank == 0 else None)
    if per_gpu and ps.get_pipeline_model_parallel_world_size() == 1:
        return Placement(dist.get_world_size() if dist.is_initialized() else 1, rank)
    first_of_model = (ps.get_tensor_model_parallel_rank() == 0
                      and ps.get_pipeline_model_parallel_rank() == 0)
    return Placement(ps.get_data_parallel_world_size(),
                     ps.get_data_parallel_rank() if first_of_model else None)


def shard_bounds(num_items: int, num_shards: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of shard ``index``: contiguous, sizes differing by at most one."""
    base, extra = divmod(num_items, num_shards)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def gather_shards(shard, place: Placement) -> list:
    """Every rank's ``shard`` (None from ranks that do not generate), gathered on all ranks and
    ordered by generator index."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [shard]
    boxes = [None] * dist.get_world_size()
    dist.all_gather_object(boxes, (place.index, shard) if place.generates else None,
                           group=place.group)
    found = sorted((b for b in boxes if b is not None), key=lambda b: b[0])
    if [i for i, _ in found] != list(range(place.num_generators)):
        raise RuntimeError(f"expected shards from generators 0..{place.num_generators - 1}, got "
                           f"{[i for i, _ in found]}")
    return [s for _, s in found]
