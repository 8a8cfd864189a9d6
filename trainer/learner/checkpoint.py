"""Trainer checkpoints in Megatron ``torch_dist`` format (model, optimizer, LR schedule, RNG, step).

Same layout as ``checkpoint_tools`` (``latest_checkpointed_iteration.txt`` + ``iter_XXXXXXX/``
with ``metadata.json`` written last), same tensor names, so ``megatron2hf`` exports any trainer
checkpoint and ``hf2megatron`` output is a valid ``--load`` for the trainer. The model part
reshards to any TP/PP on load; optimizer state is saved per rank (resume keeps the layout).
"""

from __future__ import annotations

import random
import shutil
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from checkpoint_tools.model_config import CheckpointError
from checkpoint_tools.torch_dist import (METADATA, iteration_dir_name, read_common, read_tracker,
                                         resolve_checkpoint_dir, write_tracker)

from .checkpoint_policy import CheckpointPolicy
from .checkpoint_space import any_rank, check_room, write_failed


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_sharded_object(state):
    """One RNG state per (PP, TP, DP) rank, stored as a ShardedObject as Megatron-LM does."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing import ShardedObject

    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
             ps.get_data_parallel_world_size())
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
              ps.get_data_parallel_rank())
    return ShardedObject("rng_state", state, shape, offset, replica_id=0)


def _state_dict(trainer, rng=None) -> dict:
    return {"model": trainer.model.module.sharded_state_dict(),
            "rng_state": _rng_sharded_object(rng if rng is not None else _rng_state())}


def _optimizer_file(ckpt: Path) -> Path:
    """Optimizer state is saved per rank (Megatron's ``mp_rank_XX`` convention): Megatron 0.16's
    sharded optimizer state dicts fail on this setup (bf16 master copies, padded buffers), and a
    resume keeps the parallel layout anyway. Model weights stay resharable (torch_dist). With the
    distributed optimizer each file holds that DP rank's shard of master weights and moments."""
    from megatron.core import parallel_state as ps

    name = (f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}_"
            f"{ps.get_pipeline_model_parallel_rank():03d}_{ps.get_data_parallel_rank():03d}.pt")
    return ckpt / "optimizer" / name


def _distributed_param_state(optimizer) -> list[dict] | None:
    """Master weights and Adam moments of a ``DistributedOptimizer``'s shard, in its own
    parameter order (its ``state_dict`` leaves them out). None for other optimizers."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if not isinstance(optimizer, DistributedOptimizer):
        return None
    return [{k: v.detach().cpu().clone() if torch.is_tensor(v) else v
             for k, v in optimizer._get_main_param_and_optimizer_states(param).items()}
            for param in optimizer.model_param_group_index_map]


def _sub_optimizers(optimizer) -> list:
    return getattr(optimizer, "chained_optimizers", [optimizer])


def _optimizer_state(optimizer) -> list[dict]:
    return [{"state_dict": sub.state_dict(), "param_state": _distributed_param_state(sub)}
            for sub in _sub_optimizers(optimizer)]


@torch.no_grad()
def _load_optimizer_state(optimizer, saved: list[dict], file: Path) -> None:
    subs = _sub_optimizers(optimizer)
    if not isinstance(saved, list) or len(saved) != len(subs):
        raise ValueError(f"{file}: optimizer state of a different optimizer layout")
    for sub, entry in zip(subs, saved):
        sub.load_state_dict(entry["state_dict"])  # allocates the state tensors it lacks
        if entry["param_state"] is None:
            continue
        # Megatron's load hands every parameter the *same* ``step`` tensor when the optimizer
        # is torch's AdamW (no Apex/TE), which then adds 1 to it once per parameter per step:
        # the bias correction of every later step would be wrong. One tensor each.
        for state in sub.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
        params = list(sub.model_param_group_index_map)
        if len(params) != len(entry["param_state"]):
            raise ValueError(f"{file}: optimizer shard of another DP layout")
        for param, tensors in zip(params, entry["param_state"]):
            sub._set_main_param_and_optimizer_states(param, tensors)
        sub._copy_main_params_to_model_params()


def save_checkpoint(trainer, save_dir: str | Path, iteration: int, *, args: Namespace | None = None,
                    extra: dict | None = None, policy: CheckpointPolicy = CheckpointPolicy()) -> Path:
    """Collective: every rank calls it. ``extra`` (e.g. rollout id, data position) goes to
    ``common.pt`` and comes back from ``load_checkpoint``. A save that cannot fit raises
    ``CheckpointSpaceError`` on every rank before writing; a write that fails raises it after.
    ``policy`` leaves out the optimizer / RNG state and, after the save, removes the older
    checkpoints it does not retain."""
    out = Path(save_dir) / iteration_dir_name(iteration)
    check_room(save_dir, out, trainer, with_optimizer=policy.save_optim)
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = _state_dict(trainer)
    if not policy.save_rng:
        state.pop("rng_state")
    state.update(args=args or Namespace(), checkpoint_version=3.0, iteration=iteration,
                 opt_param_scheduler=trainer.scheduler.state_dict(), step=trainer.step,
                 extra=extra or {}, saved={"optimizer": policy.save_optim, "rng": policy.save_rng})
    _write(trainer, state, out, save_dir, with_optimizer=policy.save_optim)
    # The tracker is written last, so a save cut short before it is never the latest.
    if dist.get_rank() == 0:
        write_tracker(save_dir, iteration)
        _retain(save_dir, policy)
    dist.barrier()
    return out


def _retain(save_dir: str | Path, policy: CheckpointPolicy) -> None:
    """Rank 0, after the tracker names the new checkpoint: delete those ``policy`` drops."""
    complete = [int(f.name.removeprefix("iter_")) for f in Path(save_dir).glob("iter_*")
                if f not in partial_checkpoints(save_dir)]
    for iteration in policy.to_remove(complete):
        shutil.rmtree(Path(save_dir) / iteration_dir_name(iteration), ignore_errors=True)


def _write(trainer, state: dict, out: Path, save_dir: str | Path, with_optimizer: bool) -> None:
    """The model (torch_dist) then this rank's optimizer file; a failure on any rank raises on
    every rank (a rank that raised alone would leave the others waiting in the next barrier)."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    error = None
    try:
        # Megatron's save goes first, into the empty folder: a folder that already holds files
        # makes it warn "Overwriting old incomplete / corrupted checkpoint" on every save.
        dist_checkpointing.save(state, str(out))
        if with_optimizer:
            (out / "optimizer").mkdir(exist_ok=True)
            torch.save(_optimizer_state(trainer.optimizer), _optimizer_file(out))
    except (OSError, RuntimeError, CheckpointException) as e:  # e.g. the disk filled up meanwhile
        error = e
    if any_rank(error is not None):  # also the barrier before the tracker: every rank is done
        raise write_failed(out, save_dir, error) from error


def load_checkpoint(trainer, load_dir: str | Path, *, policy: CheckpointPolicy = CheckpointPolicy()
                    ) -> dict:
    """Restore weights (+ optimizer, scheduler, RNG, step as ``policy`` says and the checkpoint
    holds); return the saved ``extra`` dict. A weights-only checkpoint (``--no-save-optim``)
    resumes only with ``--no-load-optim``: a ``CheckpointError`` says so."""
    from megatron.core import dist_checkpointing

    ckpt = resolve_checkpoint_dir(load_dir)
    common = read_common(ckpt)
    saved = common.get("saved", {"optimizer": True, "rng": True})
    load_optimizer = _wants_optimizer(ckpt, saved["optimizer"], policy.load_optim)
    state = _state_dict(trainer)
    if not (policy.load_rng and saved["rng"]):
        state.pop("rng_state")
    loaded = dist_checkpointing.load(state, str(ckpt))
    trainer.model.module.load_state_dict(loaded["model"], strict=False)
    if load_optimizer:
        file = _optimizer_file(ckpt)
        if not file.is_file():
            raise CheckpointError(f"{file}: no optimizer state for this rank; resume with the "
                                  "parallel layout the checkpoint was saved with, or pass "
                                  "--no-load-optim to go on from its weights with a fresh "
                                  "optimizer")
        _load_optimizer_state(trainer.optimizer,
                              torch.load(file, map_location="cpu", weights_only=False), file)
    # the schedule and step go on either way: --no-load-optim restarts Adam's moments only
    trainer.scheduler.load_state_dict(common["opt_param_scheduler"])
    trainer.step = int(common.get("step", 0))
    if "rng_state" in state:
        _set_rng_state(loaded["rng_state"])
    return dict(common.get("extra") or {})


def _wants_optimizer(ckpt: Path, saved: bool, wanted: bool) -> bool:
    """Whether to load the optimizer state of ``ckpt``; refuses a weights-only checkpoint unless
    the optimizer is not wanted, and warns (rank 0) when it is left behind."""
    if wanted and not saved:
        raise CheckpointError(
            f"{ckpt} holds weights only (saved with --no-save-optim): resuming exactly needs "
            f"Adam's state; pass --no-load-optim to go on from these weights with a fresh "
            f"optimizer, or --load a checkpoint saved without --no-save-optim")
    if not wanted and dist.get_rank() == 0:
        print(f"warning: --no-load-optim: {ckpt.name}'s weights with a fresh optimizer (Adam's "
              f"moments start from zero; the learning-rate schedule goes on)", flush=True)
    return wanted and saved


def latest_iteration(save_dir: str | Path) -> int | None:
    it = read_tracker(save_dir)
    return None if it in (None, "release") else int(it)


def is_trainer_checkpoint(path: str | None) -> bool:
    """Whether ``path`` is a checkpoint this trainer saved (a run to resume), not only weights."""
    if not path or not Path(path).exists() or read_tracker(path) in (None, "release"):
        return False
    return "extra" in read_common(resolve_checkpoint_dir(path))


def partial_checkpoints(save_dir: str | Path) -> list[Path]:
    """The ``iter_*`` folders under ``save_dir`` that no resume will ever read: saves cut short
    (the tracker is written after every rank finished, so it never names one; Megatron's
    ``metadata.json`` is missing, or the folder is newer than the tracker)."""
    latest = latest_iteration(save_dir)
    partial = []
    for folder in sorted(Path(save_dir).glob("iter_*")):
        number = folder.name.removeprefix("iter_")
        if not (folder.is_dir() and number.isdigit()):
            continue
        if not (folder / METADATA).is_file() or latest is None or int(number) > latest:
            partial.append(folder)
    return partial


def remove_partial(save_dir: str | Path) -> None:
    """Collective: rank 0 removes :func:`partial_checkpoints`, one line each."""
    if dist.get_rank() == 0:
        for folder in partial_checkpoints(save_dir):
            print(f"[startup] removing {folder}: a save that did not finish (interrupted)",
                  flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()
