"""Packages whose public names load on first use (so ``--help`` imports no torch): every name is
the object its module defines, whichever submodule was imported first. A name that is also a
submodule's (``trainer.algorithms.policy_loss``, ``evaluation.grader.normalize``) is the trap:
the import system sets the submodule as the package's attribute when it loads, so a lazy lookup
never runs and callers get a module where they expected the function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = ["trainer.algorithms", "evaluation.grader", "sglang_kvc.compression", "sglang_kvc"]

PROBE = """
import importlib, pkgutil, sys, types
pkg = importlib.import_module(sys.argv[1])
for info in pkgutil.iter_modules(pkg.__path__):  # every submodule first, by its own name
    try:
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    except ImportError:  # an optional kernel (Triton) this machine lacks
        pass
bad = [n for n in pkg.__all__ if isinstance(getattr(pkg, n), types.ModuleType)]
print("modules where names should be:", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_exported_names_are_not_shadowed_by_submodules(package):
    env_path = f"{ROOT}:{ROOT / 'sglang-kvc'}"
    proc = subprocess.run([sys.executable, "-c", PROBE, package], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": env_path})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
