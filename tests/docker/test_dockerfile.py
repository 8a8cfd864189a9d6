"""docker/Dockerfile without building it: a CUDA PyTorch base, every COPY/ADD source and every
``scripts/...`` it or its README names exists, and the project is installed only through
scripts/setup.sh with the image's torch kept (``SPARSE_RL_TORCH=system``, whose refusals are
tested here too)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
# official CUDA PyTorch images: Docker Hub's pytorch/pytorch (<torch>-cuda<x.y>-cudnn<n>-...) or NGC's
CUDA_PYTORCH = re.compile(r"^(pytorch/pytorch:\d+\.\d+(\.\d+)?-cuda\d+\.\d+-cudnn\d+-(runtime|devel)"
                          r"|nvcr\.io/nvidia/pytorch:\d{2}\.\d{2}-py3)$")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        current = ""
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions((DOCKER / "Dockerfile").read_text())


def _base_image(steps) -> str:
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)
    image = next(a for k, a in steps if k == "FROM").split()[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m[1]], image)


def test_parser_joins_continuations():
    steps = instructions("# c\nFROM a\nRUN x \\\n    && y\n\nCOPY b c\n")
    assert steps == [("FROM", "a"), ("RUN", "x && y"), ("COPY", "b c")]


def test_base_image_is_an_official_cuda_pytorch_image(dockerfile):
    assert CUDA_PYTORCH.match(_base_image(dockerfile)), _base_image(dockerfile)
    assert [k for k, _ in dockerfile].count("FROM") == 1


def test_copy_and_add_sources_exist(dockerfile):
    """Sources are relative to the build context, the repository root."""
    copies = [a for k, a in dockerfile if k in ("COPY", "ADD")]
    assert copies
    for args in copies:
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"{args}: {source} not in the repository"


def test_every_script_named_exists():
    texts = [(DOCKER / n).read_text() for n in ("Dockerfile", "README.md")]
    named = {m for t in texts for m in re.findall(r"\bscripts/[\w./-]+\.sh\b", t)}
    assert "scripts/setup.sh" in named and "scripts/run-qwen2.5-3b-rkv.sh" in named
    for path in named:
        assert (ROOT / path).is_file(), path


def test_setup_sh_is_the_only_install_path(dockerfile):
    runs = " ".join(a for k, a in dockerfile if k == "RUN")
    assert "bash scripts/setup.sh" in runs
    assert not re.search(r"\bpip3?\s+install\b|\bconda\s+install\b|\buv\s+pip\b", runs), runs
    # the image's torch by default (a build argument: a base without torch takes auto), set in
    # the environment before setup.sh runs
    order = [(k, a) for k, a in dockerfile if "SPARSE_RL_TORCH" in a or "setup.sh" in a]
    assert order[:2] == [("ARG", "SPARSE_RL_TORCH=system"), ("ENV", "SPARSE_RL_TORCH=${SPARSE_RL_TORCH}")], order
    assert "setup.sh" in order[2][1], order


def test_no_build_setting_stays_in_the_image(dockerfile):
    """pip's build-time config (docker/smoke.sh's mirror) is a build argument, empty by default,
    never an ENV of the image."""
    assert ("ARG", "PIP_CONFIG_FILE=") in dockerfile
    env = " ".join(a for k, a in dockerfile if k == "ENV")
    assert "PIP_" not in env, env


def test_readme_has_the_run_lines():
    readme = (DOCKER / "README.md").read_text()
    assert "docker build -f docker/Dockerfile" in readme
    assert re.search(r"docker run --gpus all --ipc=host .*\n(.*\n)*.*bash scripts/run-qwen2\.5-3b-rkv\.sh",
                     readme)
    assert "-e RAY=1" in readme and "ray start --head" in readme


def test_dockerignore_keeps_the_host_venv_out():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored


def _setup(tmp_path: Path, torch_mode: str) -> subprocess.CompletedProcess:
    """setup.sh with a Python that has no torch, into a venv path that does not exist yet."""
    fake = tmp_path / "python-without-torch"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "VENV": str(tmp_path / "venv"),
           "SPARSE_RL_TORCH": torch_mode}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, text=True,
                          capture_output=True, timeout=60)


def test_setup_system_torch_refuses_a_python_without_torch(tmp_path):
    proc = _setup(tmp_path, "system")
    assert proc.returncode == 1 and "SPARSE_RL_TORCH=system but" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


def test_setup_rejects_an_unknown_torch_mode(tmp_path):
    proc = _setup(tmp_path, "gpu")
    assert proc.returncode == 1 and "SPARSE_RL_TORCH=gpu: expected auto or system" in proc.stderr
