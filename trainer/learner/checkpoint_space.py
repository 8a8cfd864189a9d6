"""Room on disk for a trainer checkpoint.

A save into a full disk fails deep inside ``torch.save`` (``unexpected pos ... vs ...``,
``basic_ios::clear: iostream error``) on every rank, after hours of training. Here the checkpoint's
size comes from the trainer's state, a save that cannot fit is one line on every rank before
anything is written, a write that fails anyway is one line naming the folder and the space left,
and startup warns when ``--save`` cannot hold one checkpoint.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from checkpoint_tools.model_config import CheckpointError
from checkpoint_tools.torch_dist import read_tracker

from ..launch import default_device

GIB = float(1 << 30)


class CheckpointSpaceError(CheckpointError):
    """A save that cannot fit, or whose write failed: one line naming the folder (a
    ``CheckpointError``, so ``trainer.train`` prints it as one)."""


def size(n: int) -> str:
    """GiB, two decimals; two significant digits below 0.01 (a tiny model is not "0.00 GiB")."""
    gib = n / GIB
    return f"{gib:.2f} GiB" if gib >= 0.01 or gib == 0 else f"{gib:.2g} GiB"


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main_tensors(sharded_state: dict) -> list[torch.Tensor]:
    """The tensors this rank writes into the torch_dist model files: the main replica of each
    shard it holds (the other data-parallel replicas write nothing). Factories (the fused QKV
    and gate/up projections) included: they are most of a layer's weights."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import (ShardedTensor, ShardedTensorFactory,
                                                          is_main_replica)

    kinds = (ShardedTensor, ShardedTensorFactory)
    return [v.data for v in nested_values(sharded_state)
            if isinstance(v, kinds) and is_main_replica(v.replica_id)]


def model_bytes(sharded_state: dict) -> int:
    """This rank's part of the torch_dist model files, in the parameters' own dtype."""
    return _tensor_bytes(main_tensors(sharded_state))


def optimizer_bytes(optimizer) -> int:
    """This rank's optimizer file: Adam's two moments per main parameter, plus the main weights
    where the optimizer keeps its own copy (mixed precision, distributed). From the parameters,
    not the state: Adam allocates its moments at the first step, and startup asks before it."""
    from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer

    total = 0
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        main = _tensor_bytes(p for group in sub.optimizer.param_groups for p in group["params"])
        total += main * (3 if isinstance(sub, MixedPrecisionOptimizer) else 2)
    return total


def rank_bytes(trainer, with_optimizer: bool = True) -> int:
    """Bytes this rank writes into one checkpoint (RNG, scheduler and args are kilobytes)."""
    model = model_bytes(trainer.model.module.sharded_state_dict())
    return model + (optimizer_bytes(trainer.optimizer) if with_optimizer else 0)


def free_bytes(folder: str | Path) -> int:
    """Free bytes on ``folder``'s filesystem; a folder not made yet asks its nearest parent."""
    path = Path(folder).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _all_reduce(value: int, op) -> int:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=default_device())
    dist.all_reduce(t, op=op)  # on the collective's device: NCCL has no CPU tensors
    return int(t.item())


def room(save_dir: str | Path, trainer, with_optimizer: bool = True) -> tuple[int, int]:
    """Collective: (bytes one checkpoint needs over all ranks, the least free bytes any rank sees
    under ``save_dir``). Every rank gets the same pair, so every rank decides the same way. The
    sum assumes the ranks share the filesystem (one host, or shared storage)."""
    need = _all_reduce(rank_bytes(trainer, with_optimizer), dist.ReduceOp.SUM)
    return need, _all_reduce(free_bytes(save_dir), dist.ReduceOp.MIN)


def check_room(save_dir: str | Path, out: Path, trainer, with_optimizer: bool = True) -> None:
    """Collective: raise on every rank, before anything is written, if the save cannot fit."""
    need, free = room(save_dir, trainer, with_optimizer)
    if free < need:
        raise CheckpointSpaceError(
            f"checkpoint {out} needs {size(need)} but {save_dir} has {size(free)} free:"
            f" pass --save a folder with more room, or remove older iter_* checkpoints there "
            f"({_latest(save_dir)})")


def _latest(save_dir: str | Path) -> str:
    it = read_tracker(save_dir)
    return (f"the latest complete checkpoint there is still iteration {it}" if it is not None
            else "no complete checkpoint there yet")


def any_rank(flag: bool) -> bool:
    """Collective: whether ``flag`` is set on some rank (so no rank waits alone in a barrier)."""
    return bool(_all_reduce(int(flag), dist.ReduceOp.MAX))


def write_failed(out: Path, save_dir: str | Path, error: BaseException | None) -> CheckpointSpaceError:
    """The one line for a write that failed on this rank (``error``) or on another (None)."""
    lines = str(error).strip().splitlines() if error is not None else []
    cause = f"{type(error).__name__}: {lines[0] if lines else ''}" if error else "on another rank"
    return CheckpointSpaceError(
        f"writing checkpoint {out} failed ({cause}) with {size(free_bytes(save_dir))} free left "
        f"in {save_dir}; {_latest(save_dir)}, and {out.name} is incomplete: remove it")


def report_space(save_dir: str | Path, trainer, policy) -> None:
    """Collective, at startup: rank 0 prints what one checkpoint will take (per parameter too)
    and the free space under ``--save``; then :func:`warn_if_short`."""
    need, free = room(save_dir, trainer, policy.save_optim)
    params = model_parameters(trainer)
    if _is_rank0():
        print(space_line(save_dir, need, free, params, policy), flush=True)
    warn_if_short(save_dir, trainer, policy.save_optim, (need, free))


def model_parameters(trainer) -> int:
    """Collective: the model's parameters over all ranks, counted as the checkpoint's bytes
    are (the same tensors: factories included; they were left out, and the line said 20.0
    bytes a parameter for a save of 12.4)."""
    mine = sum(t.numel() for t in main_tensors(trainer.model.module.sharded_state_dict()))
    return _all_reduce(mine, dist.ReduceOp.SUM)


def space_line(save_dir, need: int, free: int, params: int, policy) -> str:
    """The startup line: one checkpoint's size, estimated from the trainer's state (the
    weights in their dtype, Adam's two moments, and the optimizer's own fp32 copy under mixed
    precision: what ``save_checkpoint`` writes, within a few percent), per parameter too."""
    what = "weights and optimizer" if policy.save_optim else "weights only (--no-save-optim)"
    kept = f"the last {policy.keep_last} kept" if policy.keep_last else "all kept"
    if policy.retain_interval:
        kept += f" and every multiple of {policy.retain_interval}"
    return (f"[startup] checkpoints in {save_dir}: {size(need)} each, estimated ({what}, "
            f"{params:,} parameters at {need / max(params, 1):.1f} bytes each; {kept}); "
            f"{size(free)} free there")


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def warn_if_short(save_dir: str | Path, trainer, with_optimizer: bool = True,
                  measured: tuple[int, int] | None = None) -> None:
    """Collective, at startup: one warning line on rank 0 when ``--save`` cannot hold one
    checkpoint now (not an error: space may be freed before the first save)."""
    need, free = measured or room(save_dir, trainer, with_optimizer)
    if free < need and _is_rank0():
        print(f"python -m trainer.train: warning: --save {save_dir} has {size(free)} free, one "
              f"checkpoint needs {size(need)}: saves will fail unless space is freed",
              file=sys.stderr, flush=True)
