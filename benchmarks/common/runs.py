"""A run folder's shared HF -> torch_dist import (the studies and the grid both prepare runs this way)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def import_once(hf: Path, work: Path) -> Path:
    """The HF -> torch_dist import every configuration's trainer would do (~25 s for 0.5B),
    done once; each run's import cache points at it."""
    target = work / "hf_import"
    if not target.is_dir():
        subprocess.run([sys.executable, "-m", "checkpoint_tools.hf2megatron", "--hf-checkpoint",
                        str(hf), "--save", str(target)], cwd=ROOT, check=True)
    return target


def prepare_run_dir(run_dir: Path, hf: Path, work: Path) -> None:
    """A run's folder whose trainer finds the shared torch_dist import in its cache."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    cache = run_dir / "logs" / "hf_import"
    if not cache.exists():
        cache.symlink_to(import_once(hf, work), target_is_directory=True)
