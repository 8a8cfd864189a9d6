"""The tiny quickstart as a user runs it (``python -m trainer.quickstart``, its own session):
Ctrl-C during its rollouts is one line (the math grader's worker processes leave SIGINT to the
trainer), a rerun after it resumes without redoing the warm-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start(work: Path, *extra: str) -> subprocess.Popen:
    """The quickstart in a session of its own, as a terminal runs it (Ctrl-C = SIGINT to the
    whole foreground process group: the trainer and every child left in its group)."""
    argv = [sys.executable, "-m", "trainer.quickstart", "--workdir", str(work), *extra]
    return subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})


def _read_until(proc: subprocess.Popen, marker: str) -> str:
    seen = ""
    while marker not in seen:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            pytest.fail(f"ended before {marker!r}: {seen[-3000:]}")
        seen += line
    return seen


@pytest.mark.launch
@pytest.mark.timeout(900)
def test_ctrl_c_during_rollouts_is_one_line(tmp_path):
    """~1 min: SIGINT to the process group once the first rollout (and so its grading) is done:
    exit 130, the one interrupt line, no traceback and no KeyboardInterrupt from any process.
    Mutation: grader workers started in the trainer's process group -> their tracebacks."""
    proc = _start(tmp_path / "qs")
    try:
        head = _read_until(proc, "first rollout (generate, reward, recompute, update, sync): ")
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = head + out
    assert proc.returncode == 130, log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "interrupted (SIGINT)" in line]
    assert len(lines) == 1 and "during rollout" in lines[0], log[-3000:]
