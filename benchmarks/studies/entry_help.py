"""Wall time of every user entry point's ``--help``, and of a few flag errors, on the CPU.

    python -m benchmarks.studies.entry_help [--repeats 3] [--root CHECKOUT] [--json out.json]

Each command runs as a user runs it: a fresh ``python -m <entry> --help`` process (warm file
cache: one unmeasured run first), timed from start to exit; the median of ``--repeats`` runs is
printed. ``--root`` times another checkout (an older commit, for a before/after), with the
same interpreter. ``tests/trainer/test_entry_messages.py`` checks that none of these imports
torch, Megatron, transformers, sympy or Ray; this prints what that buys.

``python -m trainer.startup.torchrun --help`` is left out: its help is torchrun's own parser
(``torch.distributed.run``), which imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the commands the README, docs/ and the scripts give users (python -m <entry>)
ENTRY_POINTS = (
    "trainer.train", "trainer.quickstart", "trainer.ray_job", "trainer.warmup",
    "trainer.startup.preflight", "sglang_kvc.launch_server",
    "checkpoint_tools.hf2megatron", "checkpoint_tools.megatron2hf", "checkpoint_tools.gguf2hf",
    "checkpoint_tools.verify", "checkpoint_tools.tiny_models", "checkpoint_tools.demo",
    "evaluation.run_eval", "evaluation.grade", "evaluation.prepare_simplelr",
    "dataset.validate", "dataset.long_arith", "dataset.countdown_r1", "dataset.synthetic",
)
# a typo or a bad value on the commands users type most: each ends in one line naming the command
FLAG_ERRORS = (
    ("trainer.train", "--lr", "abc"),
    ("trainer.quickstart", "--modle", "x"),
    ("sglang_kvc.launch_server", "--model-path", "m", "--port", "http"),
    ("checkpoint_tools.hf2megatron", "--hf-checkpoint", "m", "--save", "out", "--tp", "0"),
)


def _env(root: Path) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "sglang-kvc")])
    return env


def time_command(argv: list[str], root: Path, repeats: int) -> tuple[float, int, str]:
    """(median seconds, exit status, last output line) of ``python -m argv`` run in ``root``."""
    command = [sys.executable, "-m", *argv]
    subprocess.run(command, cwd=root, env=_env(root), capture_output=True)  # warm the file cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=root, env=_env(root), capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return statistics.median(times), proc.returncode, lines[-1] if lines else ""


def measure(root: Path, repeats: int) -> list[dict]:
    cases = [[entry, "--help"] for entry in ENTRY_POINTS] + [list(c) for c in FLAG_ERRORS]
    rows = []
    for argv in cases:
        seconds, status, last = time_command(argv, root, repeats)
        rows.append({"command": "python -m " + " ".join(argv), "seconds": round(seconds, 3),
                     "exit": status, "last_line": last})
        print(f"{seconds:6.2f} s  exit {status}  python -m {' '.join(argv)}", flush=True)
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed runs per command (median)")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to time (default: this)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, {sys.executable}, checkout {args.root}")
    rows = measure(args.root.resolve(), args.repeats)
    helps = [r["seconds"] for r in rows if r["command"].endswith("--help")]
    print(f"--help: median {statistics.median(helps):.2f} s, slowest {max(helps):.2f} s over "
          f"{len(helps)} entry points")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
