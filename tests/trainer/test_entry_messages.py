"""Flag errors name the command the user typed (``SPARSE_RL_COMMAND``, set by the scripts and the
outer entry points: ``trainer/startup/interrupt.py``), and what building a parser imports: no
entry point's ``--help`` or flag error imports torch, Megatron, transformers, sympy or Ray, so
each answers in about a second (``benchmarks/studies/entry_help.py`` times them; docs/benchmarks.md).

Mutation checks: ``import torch`` back at the top of trainer/launch.py fails the parser tests,
the ``--help`` of trainer.train, ray_job and preflight and the flag errors of trainer.train and
quickstart; ``POLICIES`` imported by sglang_kvc/server_args.py again fails those and
launch_server's; the early parse removed from checkpoint_tools/hf2megatron.py fails its two
rows; sympy imported at the top of evaluation/grader/equivalence.py fails run_eval and grade."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.studies.entry_help import ENTRY_POINTS, FLAG_ERRORS  # the one list of them

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "megatron", "transformers", "sympy", "ray")  # seconds each, on a CPU


def _run(module: str, *argv: str, command: str | None = None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "SPARSE_RL_COMMAND"}
    env["PYTHONWARNINGS"] = "ignore"  # as the scripts set it: Megatron's notes about TE/Apex
    if command is not None:
        env["SPARSE_RL_COMMAND"] = command
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, text=True, env=env,
                          capture_output=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_quickstart_typo_names_the_script():
    """``./scripts/quickstart.sh --modle x``: the trainer's parser judges the flag, the error
    names the script (it used to name ``python -m trainer.train``). Mutation: check_trainer_flags's
    parse_args without ``prog=`` -> ``python -m trainer.train: error``."""
    rc, out = _run("trainer.quickstart", "--modle", "x",
                   command="./scripts/quickstart.sh --modle x")
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(
        "quickstart.sh: error: unrecognized arguments: --modle x"), out


def test_a_ray_job_typo_names_the_ray_job():
    rc, out = _run("trainer.ray_job", "--actor-num-gpus-per-node", "1", "--hf-checkpoint", "m",
                   "--prompt-data", "d.jsonl", "--modle", "x")
    assert rc == 2 and "Traceback" not in out, out
    assert "python -m trainer.ray_job: error: unrecognized arguments: --modle x" in out, out


PROBE = textwrap.dedent("""
    import sys
    {build}
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    print("heavy:", ",".join(heavy))
""")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARSE_RL_COMMAND"}
    return {**env, "PYTHONWARNINGS": "ignore",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sglang-kvc'}"}


def _imports_while_building(build: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(build=build, heavy=HEAVY)], cwd=ROOT,
                          text=True, capture_output=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1].removeprefix("heavy:").strip()


def test_the_checkpoint_flags_and_the_interrupt_line_import_no_torch():
    assert _imports_while_building(
        "import argparse\n"
        "from trainer.learner.checkpoint_policy import add_checkpoint_args\n"
        "from trainer.startup import interrupt\n"
        "add_checkpoint_args(argparse.ArgumentParser())") == ""


def test_building_the_trainer_parser_imports_no_torch():
    """``--help`` builds the whole parser: every package's flags, none of the heavy imports."""
    assert _imports_while_building(
        "from trainer.arguments import build_parser\nbuild_parser()") == ""


def test_checking_a_whole_trainer_command_imports_no_torch(tmp_path):
    """Every check of ``check_args`` on a command that passes them all, the engine's flags by
    the server's rules and the dynamic-sampling filter included: a flag error found there is
    as fast as a typo."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    argv = ["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "d.jsonl"),
            "--eval-prompt-data", "e", str(tmp_path / "d.jsonl"), "--sglang-compress-algorithm",
            "rkv", "--adaptive-budget-max", "1024", "--dynamic-sampling-filter-path",
            "reward_nonzero_std", "--max-staleness", "1", "--rollout-server-urls", "http://h:1"]
    assert _imports_while_building(
        f"from trainer.arguments import parse_args\nparse_args({argv!r})") == ""


# Runs the cases as ``python -m`` would (runpy, as __main__), several in one process to keep the
# test short; a case that loads something heavy ends its process, so every case starts clean.
ENTRY_PROBE = textwrap.dedent("""
    import contextlib, io, json, runpy, sys
    for argv in json.loads(sys.argv[1]):
        sys.argv, out = list(argv), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
                code = None
            except SystemExit as e:
                code = e.code
        heavy = sorted(m for m in {heavy!r} if m in sys.modules)
        print(json.dumps(dict(argv=argv, code=code, output=out.getvalue(), heavy=heavy)))
        if heavy:
            break
""")


def _run_entries(cases: list[list[str]]) -> dict[tuple[str, ...], dict]:
    runs: dict[tuple[str, ...], dict] = {}
    while len(runs) < len(cases):
        rest = cases[len(runs):]
        proc = subprocess.run([sys.executable, "-c", ENTRY_PROBE.format(heavy=HEAVY),
                               json.dumps(rest)], cwd=ROOT, text=True, capture_output=True,
                              timeout=600, env=_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        for line in (x for x in proc.stdout.splitlines() if x.startswith("{")):
            run = json.loads(line)
            runs[tuple(run["argv"])] = run
    return runs


@pytest.fixture(scope="module")
def help_runs() -> dict[tuple[str, ...], dict]:
    return _run_entries([[entry, "--help"] for entry in ENTRY_POINTS])


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_points_help_imports_nothing_heavy(help_runs, entry):
    run = help_runs[(entry, "--help")]
    assert run["code"] == 0 and "usage:" in run["output"], run["output"][-2000:]
    assert run["heavy"] == [], f"python -m {entry} --help imported {run['heavy']}"


@pytest.mark.parametrize("argv", FLAG_ERRORS, ids=lambda argv: argv[0])
def test_a_flag_error_is_one_line_naming_the_command_without_torch(argv):
    """Each in a process of its own: the command an error names is process state (interrupt's)."""
    run = _run_entries([list(argv)])[tuple(argv)]
    lines = run["output"].strip().splitlines()
    assert run["code"] == 2 and len(lines) == 1 and "Traceback" not in run["output"], run["output"]
    command = {"checkpoint_tools.hf2megatron": "hf2megatron"}.get(argv[0], f"python -m {argv[0]}")
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    assert run["heavy"] == [], f"{argv} imported {run['heavy']}"
