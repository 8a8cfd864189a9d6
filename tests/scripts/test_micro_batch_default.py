"""Issue 60: the run scripts, the recipes and the quickstart leave ``--max-tokens-per-gpu`` to the
trainer's size from free memory (``learner/token_budget.py``): 8,192-token micro-batches halved
the RL step's speed on one H200. A launcher that must pin one says why in a ``# reason:``
comment on the line or just above it (the grids: several runs share one GPU)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("run-*.sh"))
# what launches the trainer with settings of its own
LAUNCHERS = [*sorted((ROOT / "scripts").rglob("*.sh")), *sorted((ROOT / "recipes").rglob("*.py")),
             ROOT / "trainer" / "quickstart.py", ROOT / "benchmarks" / "grid" / "waves.py",
             ROOT / "benchmarks" / "grid" / "correction_grid.py"]
# a literal micro-batch: the flag then a number (shell or a Python list), or a shell default
PINNED = re.compile(r"""max-tokens-per-gpu['"]?,?\s+['"]?\d|MAX_TOKENS_PER_GPU:-\d""")
REASON_LINES = 3  # a `# reason:` this many lines above counts (a comment over a short block)


def pinned_without_reason(path: Path) -> list[str]:
    """``file:line`` of each literal micro-batch with no ``# reason:`` on it or just above."""
    lines = path.read_text().splitlines()
    bad = []
    for i, line in enumerate(lines):
        if PINNED.search(line) and not any("# reason:" in ln
                                           for ln in lines[max(0, i - REASON_LINES):i + 1]):
            bad.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{i + 1}")
    return bad


def test_no_launcher_pins_the_micro_batch_without_a_reason():
    bad = [hit for path in LAUNCHERS for hit in pinned_without_reason(path)]
    assert not bad, f"--max-tokens-per-gpu pinned without a '# reason:' comment: {bad}"


def test_the_check_finds_a_pin_and_accepts_a_reason(tmp_path):
    """The checker itself: each way a pin is written is found; a reason above it clears it."""
    f = tmp_path / "launcher.py"
    f.write_text('flags = ["--max-tokens-per-gpu", "8192"]\n'
                 'MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-10240}"\n'
                 '    --max-tokens-per-gpu 9216 \\\n'
                 'ok = ["--max-tokens-per-gpu", str(n)]\n')
    assert [h.rsplit(":", 1)[1] for h in pinned_without_reason(f)] == ["1", "2", "3"]
    f.write_text('# reason: six runs share one GPU\nflags = ["--max-tokens-per-gpu", "8192"]\n')
    assert pinned_without_reason(f) == []


def _dry_run(tmp_path: Path, script: str, **env_vars: str) -> list[str]:
    """The trainer command a script prints with DRY_RUN=1 (nothing on disk, no GPU)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUM_GPUS", "TP", "PP", "MAX_TOKENS_PER_GPU", "EVAL_SETS")}
    env.update(DRY_RUN="1", SAVE_DIR=str(tmp_path / "save"), DATA_DIR=str(tmp_path / "data"),
               MODEL_DIR=str(tmp_path / "model"), EVAL_DIR=str(tmp_path / "eval"),
               PYTHON="/nonexistent/python", NUM_GPUS="2", **env_vars)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / script)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


@pytest.mark.parametrize("script", RUN_SCRIPTS)
def test_run_scripts_leave_the_micro_batch_to_the_trainer(tmp_path, script):
    argv = _dry_run(tmp_path, script)
    assert "trainer.train" in argv and "--max-tokens-per-gpu" not in argv, " ".join(argv)


def test_max_tokens_per_gpu_still_pins_one(tmp_path):
    argv = _dry_run(tmp_path, "run-qwen2.5-1.5b-rkv.sh", MAX_TOKENS_PER_GPU="12288")
    assert argv[argv.index("--max-tokens-per-gpu") + 1] == "12288"
