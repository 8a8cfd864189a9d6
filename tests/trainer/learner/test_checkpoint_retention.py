"""Weights-only saves (``--no-save-optim``), the refusal to resume from one and
``--no-load-optim``, and ``--save-retain``, on two spawned gloo ranks (DP=2) of a tiny trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint_tools import cpu_megatron

SPACE_TESTS = str(Path(__file__).with_name("test_checkpoint_space.py"))


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _weights(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def retention_task(rank, world, port, hf_dir, cache, save_dir):
    from checkpoint_tools.model_config import CheckpointError
    from trainer.learner.checkpoint import load_checkpoint, save_checkpoint
    from trainer.learner.checkpoint_policy import CheckpointPolicy
    from trainer.learner.checkpoint_space import model_bytes, room

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1, seed=1234)
    trainer = cpu_megatron._resolve_task((SPACE_TESTS, "_trained"))(hf_dir, cache)
    weights_only = CheckpointPolicy(save_optim=False, retain=2)
    full = _folder_bytes(save_checkpoint(trainer, save_dir, 1, extra={"it": 1}))
    lean = [_folder_bytes(save_checkpoint(trainer, save_dir, i, extra={"it": i},
                                          policy=weights_only)) for i in (2, 3, 4)][-1]
    out = dict(full=full, lean=lean,
               estimate=room(save_dir, trainer, with_optimizer=False)[0],
               model=model_bytes(trainer.model.module.sharded_state_dict()),
               kept=sorted(p.name for p in Path(save_dir).glob("iter_*")))
    before = _weights(trainer)
    for p in trainer.model.parameters():  # so that a load has something to restore
        p.data.add_(1.0)
    try:
        load_checkpoint(trainer, save_dir)
        out["refused"] = None
    except CheckpointError as e:
        out["refused"] = str(e)
    out["extra"] = load_checkpoint(trainer, save_dir, policy=CheckpointPolicy(load_optim=False))
    out["restored"] = all(torch.equal(a, b) for a, b in zip(before, _weights(trainer)))
    return out


@pytest.fixture(scope="module")
def results(tiny_model_factory, tmp_path_factory):
    hf = tiny_model_factory("qwen2-untied")
    tmp = tmp_path_factory.mktemp("retain")
    save_dir = tmp / "save"
    return cpu_megatron.run_on_ranks((__file__, "retention_task"), 2, str(hf), str(tmp / "c"),
                                     str(save_dir)), save_dir


def test_weights_only_save_holds_the_model_alone(results):
    """Mutation: writing the optimizer file despite save_optim=False -> lean ~ full."""
    (r, _), _ = results
    assert r["lean"] < 0.4 * r["full"], r  # Adam's moments were most of it
    assert abs(r["estimate"] - r["lean"]) <= 0.2 * r["lean"], r
    assert r["estimate"] >= r["model"]


def test_save_retain_keeps_the_last_two(results):
    """Mutation: no _retain after the tracker -> iter_0000001..4 all stay."""
    (r, _), _ = results
    assert r["kept"] == ["iter_0000003", "iter_0000004"]


def test_resuming_from_weights_only_refuses_unless_no_load_optim(results):
    (r0, r1), save_dir = results
    for r in (r0, r1):
        assert "\n" not in r["refused"] and "--no-save-optim" in r["refused"], r["refused"]
        assert "--no-load-optim" in r["refused"] and str(save_dir / "iter_0000004") in r["refused"]
        assert r["extra"] == {"it": 4} and r["restored"]
