"""``run_benchmark``: a benchmark script run as a user runs it (its own process, the repository and
the engine package on PYTHONPATH), failing the test with the script's last output if it fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_benchmark():
    def run(module: str, *flags: str, timeout: int = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONWARNINGS": "ignore",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "sglang-kvc"), str(ROOT)])}
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        return proc

    return run
