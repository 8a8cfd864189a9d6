"""dataset/: validator (file and line of bad rows), synthetic generators."""

import random
import subprocess
import sys
from pathlib import Path

import pytest

from dataset.formats import row_problem
from dataset.synthetic import arithmetic_task, make_rows
from dataset.validate import validate_file

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "train"


def test_row_rules():
    assert row_problem({"prompt": "hi", "label": "1"}) is None
    assert row_problem({"prompt": [{"role": "user", "content": "hi"}], "label": "1"}) is None
    assert "missing 'label'" in row_problem({"prompt": "hi"})
    assert "missing 'prompt'" in row_problem({"label": "1"})
    assert "role" in row_problem({"prompt": [{"role": "bot", "content": "x"}], "label": "1"})
    assert "assistant" in row_problem({"prompt": [{"role": "assistant", "content": "x"}], "label": "1"})
    assert "label" in row_problem({"prompt": "hi", "label": 3})
    assert "empty" in row_problem({"prompt": "", "label": "1"})
    assert row_problem({"prompt": "hi", "label": ""}, allow_empty_label=True) is None


def test_validator_names_file_and_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n\n{"prompt": "b"}\nnot json\n')
    report = validate_file(path)
    assert report.errors[0] == f"{path}:3: missing 'label'"
    assert report.errors[1].startswith(f"{path}:4: not valid JSON")
    proc = subprocess.run([sys.executable, "-m", "dataset.validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1 and f"{path}:3: missing 'label'" in proc.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": [{"role": "user", "content": "q"}], "label": "1"}\n')
    proc = subprocess.run([sys.executable, "-m", "dataset.validate", str(good)], capture_output=True, text=True)
    assert proc.returncode == 0 and "1 rows" in proc.stdout


def test_validator_lists_every_bad_line_up_to_max_errors(tmp_path):
    """A line that is not JSON does not end the check: each bad line is listed, up to
    --max-errors, then the count of the rest; the exit status is 1."""
    path = tmp_path / "data.jsonl"
    good = '{"prompt": "a", "label": "1"}'
    path.write_text("\n".join(["not json", good, '{"prompt": "b"', good, '{"label": "2"}', "[1",
                               good]) + "\n")
    report = validate_file(path)
    assert [e.split(": ", 1)[0] for e in report.errors] == [f"{path}:{n}" for n in (1, 3, 5, 6)]
    assert report.rows == 7 and report.bad_rows == 4
    proc = subprocess.run([sys.executable, "-m", "dataset.validate", str(path), "--max-errors", "3"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"{path}:1: not valid JSON (Expecting value)",
        f"{path}:3: not valid JSON (Expecting ',' delimiter)",
        f"{path}:5: missing 'prompt'",
        f"{path}: 1 more bad row(s) not listed (--max-errors 3)"]
    assert proc.stdout.strip().endswith(": 4 error(s)")


def test_arithmetic_labels_match_python_eval():
    rng = random.Random(1)
    for steps in (1, 2, 3, 5):
        for _ in range(50):
            task = arithmetic_task(rng, steps)
            assert eval(task["expression"], {"__builtins__": {}}) == task["answer"]  # noqa: S307
            assert task["expression"].count(" ") == 2 * steps


def test_synthetic_rows_validate(tmp_path):
    from dataset.formats import write_rows

    for chat in (False, True):
        path = tmp_path / f"rows_{chat}.jsonl"
        write_rows(path, make_rows("countdown", 20, 0, chat) + make_rows("arithmetic", 20, 0, chat))
        report = validate_file(path)
        assert report.errors == [] and report.rows == 40
    assert make_rows("arithmetic", 5, 7, False) == make_rows("arithmetic", 5, 7, False)  # seeded


def test_shared_training_files_validate():
    for name in ("simplelr_qwen_level3to5", "simplelr_level3to5"):
        path = SHARED / name / "train.jsonl"
        if not path.is_file():
            pytest.skip(f"shared training data not present at {path}")
        report = validate_file(path)
        assert report.rows == 8523
        assert report.errors == [f"{path}:5055: 'label' must be a non-empty string, got ''",
                                 f"{path}:5159: 'label' must be a non-empty string, got ''"]
        assert validate_file(path, allow_empty_label=True).errors == []
