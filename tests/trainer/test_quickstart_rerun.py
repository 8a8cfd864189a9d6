"""The quickstart run again in its workdir: finished, it says so (what it got, how to run anew)
and trains nothing; with a complete checkpoint, it resumes without redoing the model and its
warm-up (they are still there). The trainer is replaced by a recorder: only the quickstart's
own decisions are under test here (test_quickstart_tiny.py runs the real thing)."""

from __future__ import annotations

import json

import pytest

from trainer import quickstart


def _workdir(tmp_path, iteration: int | None, rewards=(0.25, 0.5, 0.75)):
    work = tmp_path / "qs"
    (work / "model").mkdir(parents=True)
    (work / "model" / "config.json").write_text("{}")
    (work / "logs").mkdir()
    (work / "logs" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "reward_mean": r}) + "\n" for i, r in enumerate(rewards)))
    if iteration is not None:
        (work / "ckpt").mkdir()
        (work / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return work


@pytest.fixture
def recorded(monkeypatch):
    """The trainer's argv per call; building or warming up a model fails the test."""
    import trainer.train

    calls = []
    monkeypatch.setattr(trainer.train, "main", lambda argv: calls.append(argv) or 0)
    for step in ("build_model", "warm_up"):
        monkeypatch.setattr(quickstart, step, lambda *a, step=step, **k: pytest.fail(f"{step} redone"))
    return calls


def _run(work, *flags):
    args, extra = quickstart.build_parser("python -m trainer.quickstart").parse_known_args(
        ["--workdir", str(work), *flags])
    return quickstart._run(args, extra, work)


def test_a_finished_run_says_it_is_complete_and_trains_nothing(tmp_path, recorded, capsys):
    work = _workdir(tmp_path, 40)
    assert _run(work) == 0
    out = capsys.readouterr().out
    assert recorded == []
    # 3 logged rollouts: k = 1, first 0.25 -> last 0.75
    assert (f"the run in {work} is complete (40 of 40 rollouts): reward mean, first 1 rollouts "
            f"0.250 -> last 1 0.750 (+0.500)") in out
    assert f"To run anew, remove {work} or give another --workdir." in out


def test_a_resume_keeps_the_warmed_up_model(tmp_path, recorded, capsys):
    work = _workdir(tmp_path, 10)
    assert _run(work) == 0
    out = capsys.readouterr().out
    assert f"resuming from checkpoint iteration 10: the warmed-up model in {work / 'model'} is kept" in out
    assert "warm-up:" not in out
    argv = recorded[0]
    assert argv[argv.index("--hf-checkpoint") + 1] == str(work / "model")
    assert argv[argv.index("--save") + 1] == str(work / "ckpt")  # the trainer resumes from it


def _build_and_warm_recorded(monkeypatch, done: list):
    import trainer.train

    monkeypatch.setattr(trainer.train, "main", lambda argv: 0)
    monkeypatch.setattr(quickstart, "build_model", lambda out, seed: done.append("build") or out)
    monkeypatch.setattr(quickstart, "warm_up", lambda *a: done.append("warm") or 0.5)


def test_no_checkpoint_builds_and_warms_up(tmp_path, monkeypatch, capsys):
    work, done = _workdir(tmp_path, None), []
    _build_and_warm_recorded(monkeypatch, done)
    assert _run(work) == 0
    assert done == ["build", "warm"] and "warm-up: 60 supervised steps" in capsys.readouterr().out


def test_an_interrupted_run_resumes_after_its_warm_up(tmp_path, monkeypatch, capsys):
    """Ctrl-C before the first checkpoint (every 10 rollouts) used to lose the warm-up too: the
    first run marks its warm-up complete, the rerun (no checkpoint yet) keeps the model."""
    work, done = _workdir(tmp_path, None), []
    _build_and_warm_recorded(monkeypatch, done)
    assert _run(work) == 0 and done == ["build", "warm"]
    assert json.loads((work / "model" / quickstart.WARM_MARK).read_text())["warmup_steps"] == 60
    capsys.readouterr()
    assert _run(work) == 0
    assert done == ["build", "warm"]  # not redone
    assert (f"resuming after the warm-up (no checkpoint yet): the warmed-up model in "
            f"{work / 'model'} is kept (no warm-up)") in capsys.readouterr().out


@pytest.mark.parametrize("other", [["--seed", "1"], ["--warmup-steps", "5"]])
def test_a_warm_up_of_other_settings_is_redone(tmp_path, monkeypatch, other):
    work, done = _workdir(tmp_path, None), []
    _build_and_warm_recorded(monkeypatch, done)
    assert _run(work) == 0
    assert _run(work, *other) == 0
    assert done == ["build", "warm"] * 2


def test_a_warm_up_cut_short_leaves_no_mark(tmp_path, monkeypatch):
    """Interrupted mid warm-up: no mark, the rerun warms up again."""
    work, done = _workdir(tmp_path, None), []
    _build_and_warm_recorded(monkeypatch, done)

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(quickstart, "warm_up", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(work)
    assert not (work / "model" / quickstart.WARM_MARK).exists()
