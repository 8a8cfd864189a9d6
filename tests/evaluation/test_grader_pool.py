"""The worker pool: hard per-item timeouts on a pathological input, results in order, CLI."""

import json
import subprocess
import sys
import time

import pytest

from evaluation.grader import GradeOptions, GraderPool, grade, grade_many

PATHOLOGICAL = "\\boxed{2003^{2002^{2001}}}"


# Unguarded, sympy's evaluation of the tower does not end (minutes and more): the bounds below
# are wide enough for a loaded 2-core machine and still far below that, so they test the guard
# and the kill, not the machine's speed (a 1.0 s margin failed once at 2.85 s under load).
NEVER = 20.0


def test_guard_keeps_in_process_grade_fast():
    start = time.monotonic()
    assert grade(PATHOLOGICAL, "5") is False
    assert time.monotonic() - start < NEVER


def test_pathological_item_times_out_and_caller_returns():
    # With the guard off, sympy really tries to evaluate the tower: only the kill saves us.
    timeout = 1.5
    with GraderPool(workers=2, timeout=timeout, options=GradeOptions(guard=False)) as pool:
        pool.map([("\\boxed{1}", "1")])  # workers started and ready: start-up is not measured
        start = time.monotonic()
        results = pool.map([(PATHOLOGICAL, "5"), ("\\boxed{0.5}", "\\frac12"), ("\\boxed{3}", "4")])
        elapsed = time.monotonic() - start
        assert results[0].timed_out and not results[0].correct
        assert "timed out" in results[0].error
        assert [r.correct for r in results[1:]] == [True, False]
        assert not any(r.timed_out for r in results[1:])
        assert timeout <= elapsed < timeout + NEVER
        assert pool.timeouts == 1
        # the killed worker is replaced: the pool keeps working
        assert [r.correct for r in pool.map([("\\boxed{2}", "2")] * 5)] == [True] * 5


def test_grade_many_order_and_dict_pairs():
    pairs = [("\\boxed{%d}" % i, str(i if i % 3 else i + 1)) for i in range(30)]
    pairs.append({"pred": "so the answer is 7", "gold": "7"})
    results = grade_many(pairs, timeout=10, workers=2)
    assert [r.correct for r in results] == [bool(i % 3) for i in range(30)] + [True]
    assert results[4].extracted == "4"


def test_pool_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout"):
        GraderPool(timeout=0)


def test_grade_cli(tmp_path):
    src = tmp_path / "pairs.jsonl"
    rows = [{"gold": "7", "pred": "\\boxed{700}"},
            {"gold": "\\frac{1}{4}", "pred": "so the answer is \\boxed{0.25}.", "id": 9}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "evaluation.grade", "--input", str(src), "--output", str(out),
                           "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["correct"] for g in graded] == [False, True]
    assert graded[1]["extracted"] == "0.25" and graded[1]["id"] == 9
    assert "graded 2 pairs: 1 correct" in proc.stderr


def test_grade_cli_names_bad_line(tmp_path):
    src = tmp_path / "pairs.jsonl"
    src.write_text('{"gold": "1", "pred": "1"}\n{"gold": "2"}\n')
    proc = subprocess.run([sys.executable, "-m", "evaluation.grade", "--input", str(src)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"{src}:2" in proc.stderr
