"""docker/smoke.sh: the image built and used as a user would (docker/README.md, "The smoke").

The whole smoke runs in ``-m launch`` only where a container engine answers (a docker daemon,
or podman); elsewhere (CI: the docker CLI without a daemon) it skips at once with the reason,
and ``SPARSE_RL_DOCKER_SMOKE=0`` skips it anywhere (it takes 5-20 minutes, docker/README.md).
Its own checks are the assertions: the dry run reads the mounted data, the tiny run writes the
checkpoint of step 2 with R-KV compressions in its metrics, /generate returns 8 tokens, the
tests inside pass. Without an engine the script stops with one line naming what to install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "docker" / "smoke.sh"
STEPS = ("base", "build", "dry-run", "train", "serve", "tests")


def _engine() -> tuple[str | None, str]:
    """(the engine smoke.sh would use, or None, and its reason)."""
    proc = subprocess.run(["bash", str(SMOKE), "--check"], capture_output=True, text=True, timeout=180)
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return (proc.stdout.strip() if proc.returncode == 0 else None), last


def _fake_engines(tmp_path: Path) -> dict:
    """PATH where `docker` is a CLI whose daemon does not answer and `podman info` fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "podman"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'Cannot connect to the daemon' >&2\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}


def test_without_an_engine_it_stops_with_what_to_install(tmp_path):
    """Mutation check: `docker_answers` returning true without asking `docker info` makes the
    script try to build with the fake docker instead, and this fails."""
    proc = subprocess.run(["bash", str(SMOKE)], env=_fake_engines(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smoke: error: no container engine"), proc.stderr
    assert "apt-get install -y podman runc" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # its temporary folder removed


def test_an_unknown_engine_is_named(tmp_path):
    proc = subprocess.run(["bash", str(SMOKE), "--check"], env={**_fake_engines(tmp_path), "ENGINE": "lxc"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ENGINE=lxc: expected docker or podman" in proc.stderr


@pytest.mark.launch
def test_smoke_builds_the_image_and_runs_it():
    if os.environ.get("SPARSE_RL_DOCKER_SMOKE") == "0":
        pytest.skip("SPARSE_RL_DOCKER_SMOKE=0")
    engine, reason = _engine()
    if engine is None:
        pytest.skip(f"docker/smoke.sh needs a container engine: {reason}")
    proc = subprocess.run(["bash", str(SMOKE)], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"smoke: ok | {engine}, image "), summary
    for step in STEPS:
        assert f" {step} " in summary, (step, summary)
