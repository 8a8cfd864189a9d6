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


def _nine_head_model(tmp_path):
    """SmolLM2-135M's attention shape (9 heads, 3 KV heads, 30 layers); only config.json is read
    before the check."""
    import json

    d = tmp_path / "nine"
    d.mkdir()
    d.joinpath("config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
        "num_key_value_heads": 3, "num_hidden_layers": 30, "intermediate_size": 1536,
        "vocab_size": 49152}))
    return d


@pytest.mark.parametrize("flags,named", [
    (["--tp", "2"], "--tp 2: this model has 9 attention heads and 3 KV heads"),
    (["--tp", "3", "--pp", "4"], "--pp 4: this model's 30 layers"),
    (["--tp", "0"], "--tp 0 --pp 1: both must be >= 1"),
])
def test_verify_refuses_a_split_the_model_cannot_take(tmp_path, flags, named):
    """Mutation: without verify._checked_inputs, --tp 2 spawns ranks that fail in tracebacks."""
    model = _nine_head_model(tmp_path)
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "checkpoint_tools.verify",
                        "--hf-checkpoint", str(model), "--load", str(tmp_path), *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in r.stderr, r.stderr
    if flags[1] == "2":
        assert "use --tp 1 or 3" in lines[0]


def test_verify_missing_load_is_one_line(tmp_path):
    model = _nine_head_model(tmp_path)
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "checkpoint_tools.verify",
                        "--hf-checkpoint", str(model), "--load", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--load" in r.stderr, r.stderr
