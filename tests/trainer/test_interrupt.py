"""Ctrl-C and SIGTERM on a training run, then the same command again: one line, no traceback, a
resume whose metrics are the uninterrupted run's (``trainer/startup/interrupt.py``, ``trainer/startup/torchrun.py``,
``train.py``'s resume from ``--save``, ``tracking.truncate_metrics``,
``learner/checkpoint.partial_checkpoints``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer.startup import interrupt
from trainer.learner.checkpoint import partial_checkpoints
from trainer.tracking import truncate_metrics

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests/trainer/interrupt_plugin.py:reward"
# measured per run, not outcomes of training: wall times, the engine's own counters and pool peak
# (a resumed engine starts empty), the tail of the rollout's timing
NOT_TRAINING = ("time", "memory/", "rollout/", "rollout_tail", "kv_pool_peak", "sync/")


def test_truncate_metrics_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "reward_mean": s / 10} for s in (0, 1, 2, 3, 4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rew')  # torn
    truncate_metrics(path, 2)  # resumed from the checkpoint of step 2
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    truncate_metrics(path, 0)  # a fresh run in the same folder starts a fresh file
    assert path.read_text() == ""


def _iteration(save: Path, n: int, *, metadata: bool = True) -> Path:
    folder = save / f"iter_{n:07d}"
    folder.mkdir(parents=True)
    if metadata:
        (folder / "metadata.json").write_text("{}")
    return folder


def test_partial_checkpoints_are_those_no_resume_reads(tmp_path):
    """Newer than the tracker (cut short before it was written) or without Megatron's
    metadata.json: partial. The tracker's and older complete ones stay."""
    kept = [_iteration(tmp_path, 1), _iteration(tmp_path, 2)]
    broken = _iteration(tmp_path, 3, metadata=False)  # an old save that died in Megatron's part
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    kept.append(_iteration(tmp_path, 4))
    cut = _iteration(tmp_path, 5)  # model written, optimizer and tracker not yet
    (tmp_path / "hf_import").mkdir()
    assert partial_checkpoints(tmp_path) == [broken, cut]
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert partial_checkpoints(tmp_path) == [*kept[:2], broken, kept[2], cut]  # nothing complete


def test_report_names_the_typed_command_and_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(interrupt.COMMAND_ENV, "./scripts/quickstart.sh --num-rollout 3")
    monkeypatch.setitem(interrupt._state, "signum", signal.SIGTERM)
    monkeypatch.setitem(interrupt._state, "doing", "rollout 3 of 8")
    line = interrupt.report(tmp_path, interrupt.command(["ignored"]))
    assert line == (f"quickstart.sh: interrupted (SIGTERM) during rollout 3 of 8; no complete "
                    f"checkpoint in {tmp_path} yet; rerun the same command to start over: "
                    f"./scripts/quickstart.sh --num-rollout 3")
    _iteration(tmp_path, 2)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert (f"the last complete checkpoint is iteration 2 ({tmp_path / 'iter_0000002'}); rerun "
            f"the same command to resume from it") in interrupt.report(tmp_path, "x")
    monkeypatch.setenv(interrupt.COMMAND_ENV, "python -m trainer.quickstart --model smollm2")
    assert interrupt.prog("x") == "python -m trainer.quickstart"


WORKER = textwrap.dedent("""
    import time
    from trainer.startup import interrupt
    interrupt.install()
    try:
        with interrupt.doing("the test's wait"):
            print("ready", flush=True)
            time.sleep(120)
    except interrupt.Interrupted:
        interrupt.say(interrupt.report(None, "again"))
        interrupt.exit(interrupt.exit_code())
""")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130),
                                      pytest.param(signal.SIGTERM, 143, marks=pytest.mark.launch)])
def test_torchrun_wrapper_ends_quietly_on_a_signal(tmp_path, sig, code):
    """torchrun forwards the signal to its two workers and would then print its agent's
    traceback and two warnings per worker; trainer.startup.torchrun leaves rank 0's line alone.
    Mutation: torchrun.py without the SignalException branch -> a traceback, rc 1."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, "-m", "trainer.startup.torchrun", "--standalone",
                             "--nproc-per-node", "2", str(worker)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen = ""
    while seen.count("ready") < 2:  # both workers wait inside the handler's reach
        line = proc.stdout.readline()
        assert line, f"the workers never started: {seen}"
        seen += line
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert proc.returncode == code, out
    assert out.count(f"interrupted ({name}) during the test's wait") == 1, out  # rank 0 only
    assert "Traceback" not in out and "death signal" not in out, out


# --- a tiny GRPO run through torchrun, interrupted twice and resumed -------------------------
@pytest.fixture(scope="module")
def tiny_run(tiny_model_factory, tmp_path_factory):
    """The tiny model, its prompts, and its torch_dist import made once (each run's --load)."""
    tmp = tmp_path_factory.mktemp("interrupt")
    hf = tiny_model_factory("qwen2.5")
    rows = [{"prompt": f"<|im_start|>user\nadd {i % 9 + 1} {i % 7 + 3}<|im_end|>\n"
                       f"<|im_start|>assistant\n", "label": str(i % 9 + 1 + i % 7 + 3)}
            for i in range(64)]
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    weights = tmp / "torch_dist"
    subprocess.run([sys.executable, "-m", "checkpoint_tools.hf2megatron", "--hf-checkpoint",
                    str(hf), "--save", str(weights)], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return hf, data, weights


def _command(hf, data, weights, out: Path) -> list[str]:
    return [sys.executable, "-m", "trainer.startup.torchrun", "--standalone", "--nproc-per-node", "2",
            "-m", "trainer.train", "--hf-checkpoint", str(hf), "--load", str(weights),
            "--prompt-data", str(data), "--save", str(out / "ckpt"), "--save-interval", "1",
            "--log-dir", str(out / "logs"), "--num-rollout", "5", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--rollout-max-response-len", "12", "--lr", "1e-3", "--kl-loss-coef", "0",
            "--custom-rm-path", PLUGIN, "--max-tokens-per-gpu", "512", "--seed", "7",
            "--sglang-max-total-tokens", "4096"]


def _launch(argv: list[str], at: str | None = None) -> tuple[int, str]:
    """The command in its own session (as a terminal runs it); ``at``: where the plugin presses
    Ctrl-C (``rollout:N``, ``save:N``; rank 0 scores 8 samples a rollout)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "INTERRUPT_SAMPLES_PER_ROLLOUT": "8",
           "INTERRUPT_AT": at or ""}
    proc = subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{at or 'the run'}: no end after 900 s: {out[-3000:]}")
    return proc.returncode, out


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def _interrupted_line(log: str) -> str:
    lines = [line for line in log.splitlines() if "interrupted (SIGINT)" in line]
    assert len(lines) == 1 and "Traceback" not in log and "death signal" not in log, log[-3000:]
    return lines[0]


@pytest.mark.launch
@pytest.mark.slow  # long; CI runs launch and not slow (tests/README.md)
@pytest.mark.timeout(2400)  # four torchrun runs of two ranks each
def test_interrupted_mid_rollout_and_mid_save_then_resumed_equals_uninterrupted(tiny_run, tmp_path):
    """Ctrl-C in rollout 3 (checkpoint 2 complete), the same command, Ctrl-C in the save of
    iteration 4 (its model written, not its optimizer), the same command to the end: each step
    logged once, the cut save removed, every training metric the uninterrupted run's.
    Mutations: no truncate_metrics -> steps 3 and 4 twice; no remove_partial -> iter_0000004
    without optimizer stays; resuming without the optimizer state -> train/* differ."""
    hf, data, weights = tiny_run
    full, cut = tmp_path / "full", tmp_path / "cut"
    rc, log = _launch(_command(hf, data, weights, full))
    assert rc == 0, log[-3000:]
    command = _command(hf, data, weights, cut)

    rc, log = _launch(command, at="rollout:3")
    line = _interrupted_line(log)
    assert rc == 130 and "during rollout 3 of 5" in line and "iteration 2" in line, line
    assert "the same command to resume from it: python -m trainer.startup.torchrun --standalone" in line
    assert line.endswith(" ".join(command[command.index("--standalone") + 1:])), line

    rc, log = _launch(command, at="save:2")  # resumed at 2: saves 3, then 4 is cut
    line = _interrupted_line(log)
    assert rc == 130 and "during the save of checkpoint iteration 4" in line, line
    assert "the last complete checkpoint is iteration 3" in line, line
    # rank 0 stopped before its optimizer file (rank 1 may have written its own meanwhile)
    assert not (cut / "ckpt" / "iter_0000004" / "optimizer" / "mp_rank_00_000_000.pt").exists()

    rc, log = _launch(command)
    assert rc == 0, log[-3000:]
    assert f"removing {cut / 'ckpt' / 'iter_0000004'}" in log
    a, b = _metrics(full), _metrics(cut)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a, b):
        for key, value in x.items():
            if isinstance(value, float) and not key.startswith(NOT_TRAINING) and "per_s" not in key:
                assert y[key] == pytest.approx(value, abs=1e-6), (x["step"], key)
