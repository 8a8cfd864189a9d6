"""The converters' command lines (scripts/*.sh call these modules): a missing path is one line
naming it, and an abbreviated flag is refused rather than expanded."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["hf2megatron", "--hf-checkpoint", "/nonexistent", "--save", "{tmp}/o"], "/nonexistent"),
    (["megatron2hf", "--load", "/nonexistent", "--output-dir", "{tmp}/o"], "/nonexistent"),
    (["gguf2hf", "--gguf", "/nonexistent.gguf", "--output-dir", "{tmp}/o"], "--gguf /nonexistent.gguf"),
    (["hf2megatron", "--hf-check", "/nonexistent", "--save", "{tmp}/o"], "required: --hf-checkpoint"),
    (["megatron2hf", "--lo", "/nonexistent", "--output-dir", "{tmp}/o"], "--lo"),
]


@pytest.mark.parametrize("argv,named", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_converter_errors_are_short(argv, named, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in argv]
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", f"checkpoint_tools.{argv[0]}", *argv[1:]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    err = [line for line in r.stderr.strip().splitlines() if "error" in line]
    assert len(err) == 1 and named in err[0], r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
