"""Bad flag values are refused before any model work (issue 70): one line naming the flag the
user typed, exit 2, no traceback, nothing built. The table walks the quickstart's own flags (by
their names, not the trainer's they become) and the trainer's; each case runs as the user runs
it (``python -m``, through runpy), and its time is printed (the issue asks < 5 s; not
asserted: a loaded machine must not fail it).

Mutations: ``check_quickstart_values`` dropped from quickstart.main -> the quickstart rows fail
(--num-rollout 0 ran the default 40 rollouts; --kv-budget -5 was reported after the warm-up
as --sglang-compress-max-prompt); ``check_trainer_values`` dropped from check_args -> the
trainer's --lr -1 reaches the optimizer (a traceback, ~20 s later)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.startup.flag_checks import AT_LEAST_ONE, BETA, NON_NEGATIVE, Bound, out_of_bounds

ROOT = Path(__file__).resolve().parents[2]

# (the flags typed, the flag the one line must name)
QUICKSTART = [
    (["--num-rollout", "0"], "--num-rollout"),
    (["--num-rollout", "-3"], "--num-rollout"),
    (["--kv-budget", "-5"], "--kv-budget"),
    (["--kv-budget", "4"], "--kv-budget"),  # not above the tiny model's window of 4
    (["--model", "smollm2", "--kv-budget", "8"], "--kv-budget"),  # smollm2's window is 8
    (["--compress-algorithm", "foo"], "--compress-algorithm"),
    (["--lr", "-1"], "--lr"),
    (["--warmup-steps", "-1"], "--warmup-steps"),
    (["--rollout-batch-size", "0"], "--rollout-batch-size"),  # a trainer flag given to it
]
TRAINER = [
    (["--lr", "-1"], "--lr"),
    (["--num-rollout", "0"], "--num-rollout"),
    (["--min-lr", "-0.5"], "--min-lr"),
    (["--adam-beta2", "1"], "--adam-beta2"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--sglang-compress-algorithm", "foo"], "--sglang-compress-algorithm"),
    (["--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "-5"],
     "--sglang-compress-max-prompt"),
]


# Every case of a table in one process, as ``python -m`` runs it (runpy, as __main__): one
# interpreter start for the table keeps the test short; each case's own time is printed.
PROBE = textwrap.dedent("""
    import contextlib, io, json, runpy, sys, time
    for argv in json.loads(sys.argv[1]):
        sys.argv, out = list(argv), io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
                code = None
            except SystemExit as e:
                code = e.code
        print(json.dumps(dict(code=code, output=out.getvalue(), seconds=time.perf_counter() - start)))
""")


def _refused(cases: list[list[str]], cwd: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "SPARSE_RL_COMMAND"}
    env.update(PYTHONWARNINGS="ignore", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'sglang-kvc'}")
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _assert_refused(runs: list[dict], table, prog: str) -> None:
    assert len(runs) == len(table)
    for run, (argv, flag) in zip(runs, table):
        print(f"{prog} {' '.join(argv)}: refused in {run['seconds']:.2f} s")
        lines = run["output"].strip().splitlines()
        assert run["code"] == 2 and len(lines) == 1 and "Traceback" not in run["output"], (argv, run)
        assert lines[0].startswith(f"{prog}: error: {flag} "), lines[0]


def test_the_quickstart_refuses_a_bad_value_before_any_model_work(tmp_path):
    work = str(tmp_path / "run")
    runs = _refused([["trainer.quickstart", "--workdir", work, *argv] for argv, _ in QUICKSTART],
                    tmp_path)
    _assert_refused(runs, QUICKSTART, "python -m trainer.quickstart")
    assert os.listdir(tmp_path) == []  # no warm-up, no model, no workdir


def test_the_trainer_refuses_a_bad_value_at_parse_time(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    head = ["trainer.train", "--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "d.jsonl")]
    runs = _refused([[*head, *argv] for argv, _ in TRAINER], tmp_path)
    _assert_refused(runs, TRAINER, "python -m trainer.train")


def test_bounds_against_hand_written_cases():
    assert AT_LEAST_ONE.holds(1) and not AT_LEAST_ONE.holds(0)
    assert NON_NEGATIVE.holds(0.0) and not NON_NEGATIVE.holds(-1e-9)
    assert BETA.holds(0.999) and not BETA.holds(1.0) and not BETA.holds(-0.1)
    assert Bound(0, inclusive=False).describe() == "> 0" and BETA.describe() == "in [0, 1)"


def test_an_automatic_value_is_never_checked_and_the_typed_name_is_used():
    args = argparse.Namespace(max_tokens_per_gpu=None, kv=0)
    assert out_of_bounds(args, {"max_tokens_per_gpu": AT_LEAST_ONE}) is None
    assert out_of_bounds(args, {"kv": AT_LEAST_ONE}, {"kv": "--kv-budget"}) == \
        "--kv-budget must be >= 1 (got 0)"
