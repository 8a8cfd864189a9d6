"""A checkpoint that cannot fit is one line on every rank before anything is written; a write
that fails midway is one line and leaves the previous checkpoint the latest; the size estimate
matches a real save. Two spawned gloo ranks (DP=2) run every case on one tiny trainer.

Where space runs short, only rank 1 is short (rank 0 sees a petabyte free): the decision must
take the least free space over the ranks. Mutation check: ``room`` reducing the free bytes with
``ReduceOp.MAX`` instead of ``MIN`` fails the no-room and the startup-warning tests (no error on
any rank, no warning)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from checkpoint_tools import cpu_megatron

POLICY_TESTS = str(Path(__file__).with_name("test_policy_model.py"))
SHORT, AMPLE = 1 << 20, 1 << 50  # free bytes on the short rank (1) and on the other (0)
DISK_FULL = ("[enforce fail at inline_container.cc:672] . unexpected pos 1195426112 vs "
             "1195426000")


def _helper(name):
    return cpu_megatron._resolve_task((POLICY_TESTS, name))


def _trained(hf_dir, cache):
    """A trainer after one GRPO update: Adam's moments exist, as in any real save."""
    from trainer.learner.grpo_update import prepare_update, run_updates

    trainer = _helper("_make_trainer")(hf_dir, cache)
    adv, corr, loss = _helper("_rl_configs")()
    batch = _helper("_rollout")(trainer, _helper("make_samples")(448), 0)
    run_updates(trainer, batch, prepare_update(trainer, batch, adv, corr), loss, 6)
    return trainer


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _error_of(fn) -> str | None:
    """The CheckpointSpaceError's message, None if nothing was raised (checked by the test:
    asserting here, in a spawned rank, would leave the other rank alone in a collective)."""
    from trainer.learner.checkpoint_space import CheckpointSpaceError

    try:
        fn()
    except CheckpointSpaceError as e:
        return str(e)
    return None


def _short_on_rank_1(monkeypatch, rank):
    import shutil

    free = SHORT if rank == 1 else AMPLE
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free))


def _no_room(trainer, save_dir, monkeypatch, rank):
    from trainer.learner.checkpoint import save_checkpoint

    _short_on_rank_1(monkeypatch, rank)
    return _error_of(lambda: save_checkpoint(trainer, save_dir, 2, extra={"it": 2}))


def _optimizer_write_fails(trainer, save_dir, monkeypatch, rank):
    """torch.save of the optimizer state fails as on a full disk, on rank 1 only: every rank
    must still raise (none may wait alone in a barrier)."""
    from trainer.learner.checkpoint import save_checkpoint

    real = torch.save

    def save(obj, f, *a, **k):
        if rank == 1 and "optimizer" in str(f):
            raise RuntimeError(f"{DISK_FULL}\nbasic_ios::clear: iostream error")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    return _error_of(lambda: save_checkpoint(trainer, save_dir, 3, extra={"it": 3}))


def _startup_warning(trainer, save_dir, monkeypatch, rank) -> str:
    import contextlib
    import io

    from trainer.learner.checkpoint_space import warn_if_short

    _short_on_rank_1(monkeypatch, rank)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        warn_if_short(save_dir, trainer)
    return err.getvalue()


def space_task(rank, world, port, hf_dir, cache, save_dir):
    import torch.distributed as dist

    from checkpoint_tools.torch_dist import read_tracker
    from trainer.learner.checkpoint import load_checkpoint, save_checkpoint
    from trainer.learner.checkpoint_space import model_parameters, room

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1, seed=1234)
    trainer = _trained(hf_dir, cache)
    estimate = room(save_dir, trainer)[0]
    params = model_parameters(trainer)
    own = sum(p.numel() for p in trainer.model.parameters())  # DP=2, TP=1: the whole model
    with pytest.MonkeyPatch().context() as m:
        warning = _startup_warning(trainer, save_dir, m, rank)
    out = save_checkpoint(trainer, save_dir, 1, extra={"it": 1})
    written = _folder_bytes(out)
    mp = pytest.MonkeyPatch()
    with mp.context() as m:
        no_room = _no_room(trainer, save_dir, m, rank)
    after_no_room = (read_tracker(save_dir), (Path(save_dir) / "iter_0000002").exists())
    with mp.context() as m:
        failed = _optimizer_write_fails(trainer, save_dir, m, rank)
    dist.barrier()
    extra = load_checkpoint(trainer, save_dir)
    return dict(warning=warning, estimate=estimate, params=params, own=own, written=written, no_room=no_room, after_no_room=after_no_room,
                failed=failed, tracker=read_tracker(save_dir), loaded=extra)


@pytest.fixture(scope="module")
def ranks(tiny_model_factory, tmp_path_factory):
    hf = tiny_model_factory("qwen2-untied")
    tmp = tmp_path_factory.mktemp("space")
    save_dir = tmp / "save"
    return cpu_megatron.run_on_ranks((__file__, "space_task"), 2, str(hf), str(tmp / "c"),
                                     str(save_dir)), save_dir


def test_estimate_is_within_20_percent_of_a_real_save(ranks):
    results, _ = ranks
    r = results[0]
    assert r["estimate"] == results[1]["estimate"]  # every rank decides on the same number
    assert abs(r["estimate"] - r["written"]) <= 0.2 * r["written"], r


def test_the_parameters_are_the_hf_checkpoints_and_bytes_each_match_the_disk(ranks, tiny_model_factory):
    """The startup line's parameter count is the model's (Megatron's own parameters; the HF
    checkpoint's, from the safetensors' shapes, plus the vocabulary rows Megatron pads the
    embedding and the output layer with), and its bytes a parameter are a real save's (issue 70:
    the quickstart's line said 20.0 for a save of 12.4, the fused projections left out)."""
    from safetensors import safe_open

    from trainer.learner.checkpoint_space import space_line

    results, save_dir = ranks
    with safe_open(str(tiny_model_factory("qwen2-untied") / "model.safetensors"), "pt") as f:
        hf_params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    r = results[0]
    assert r["params"] == results[1]["params"] == r["own"]
    padding = r["params"] - hf_params  # two matrices of hidden 64, padded to 128 rows at most
    assert 0 <= padding < 2 * 64 * 128 and padding % (2 * 64) == 0, (r["params"], hf_params)
    # two data-parallel ranks: the weights once, each rank's optimizer file (~4 + 2 x 8 bytes)
    on_disk = r["written"] / r["params"]
    print(f"{r['params']:,} parameters; estimate {r['estimate'] / r['params']:.2f} bytes each, "
          f"disk {on_disk:.2f}")
    assert abs(r["estimate"] / r["params"] - on_disk) <= 0.2 * on_disk
    policy = SimpleNamespace(save_optim=True, keep_last=1, retain_interval=None)
    line = space_line(save_dir, r["estimate"], 1 << 40, r["params"], policy)
    assert f"{r['params']:,} parameters at {r['estimate'] / r['params']:.1f} bytes each" in line, line


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_no_room_is_one_line_on_every_rank_and_writes_nothing(ranks):
    """Only rank 1 is short: both raise, naming rank 1's free space."""
    from trainer.learner.checkpoint_space import size

    results, save_dir = ranks
    for r in results:
        msg = r["no_room"]
        assert msg is not None, "a save that cannot fit on rank 1 went ahead"
        assert "\n" not in msg and f"has {size(SHORT)} free" in msg
        assert f"{save_dir}" in msg and "GiB free" in msg and "--save" in msg
        assert "GiB but" in msg and "still iteration 1" in msg
        assert r["after_no_room"] == ("1", False)  # tracker unchanged, no iter_0000002 at all


def test_a_failed_write_is_one_line_and_the_previous_checkpoint_stays_latest(ranks):
    results, save_dir = ranks
    assert "unexpected pos 1195426112 vs 1195426000" in results[1]["failed"]
    assert "on another rank" in results[0]["failed"]
    for r in results:
        assert "\n" not in r["failed"]
        assert str(save_dir / "iter_0000003") in r["failed"] and "GiB free left" in r["failed"]
        assert "still iteration 1" in r["failed"]
        assert r["tracker"] == "1" and r["loaded"] == {"it": 1}


def test_startup_warns_once_when_save_cannot_hold_a_checkpoint(ranks):
    """Rank 0 speaks for the job, though rank 1 is the one short of space."""
    from trainer.learner.checkpoint_space import size

    results, save_dir = ranks
    warning = results[0]["warning"]
    assert f"has {size(SHORT)} free" in warning
    assert warning.count("\n") == 1 and "warning:" in warning and f"--save {save_dir}" in warning
    assert "GiB free" in warning and "needs" in warning
    assert results[1]["warning"] == ""  # rank 0 speaks for the job
