"""dataset/: validator (file and line of bad rows), SimpleRL rebuild, synthetic generators."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dataset.formats import row_problem
from dataset.prepare_simplelr import chat_row, prepare, qwen_row, read_source
from dataset.synthetic import arithmetic_task, check_countdown, countdown_task, make_rows, score_countdown
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


def _shared_rows(name, count):
    path = SHARED / name / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"shared training data not present at {path}")
    with open(path) as f:
        return [json.loads(next(f)) for _ in range(count)]


def test_prepare_rebuilds_shared_rows_exactly(tmp_path):
    qwen = _shared_rows("simplelr_qwen_level3to5", 5)
    chat = _shared_rows("simplelr_level3to5", 5)
    suffix = "\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    source = []
    for row in chat:
        user = row["prompt"][1]["content"]
        assert user.endswith(suffix)
        source.append({"question": user[:-len(suffix)], "gt_answer": row["label"], "level": 4})
    source.insert(2, {"question": "An easy level 2 question", "gt_answer": "1", "level": 2})
    src = tmp_path / "v0.json"
    src.write_text(json.dumps(source))
    counts = prepare(read_source(src), tmp_path / "out")
    assert counts == {"simplelr_qwen_level3to5": 5, "simplelr_level3to5": 5}
    rebuilt_qwen = [json.loads(x) for x in (tmp_path / "out/simplelr_qwen_level3to5/train.jsonl").read_text().splitlines()]
    rebuilt_chat = [json.loads(x) for x in (tmp_path / "out/simplelr_level3to5/train.jsonl").read_text().splitlines()]
    assert rebuilt_qwen == qwen
    assert rebuilt_chat == chat


def test_prepare_from_math_directory_and_jsonl(tmp_path):
    math_dir = tmp_path / "MATH" / "train" / "algebra"
    math_dir.mkdir(parents=True)
    for i, (level, sol) in enumerate([("Level 3", "so $\\boxed{\\frac{1}{2}}$"), ("Level 1", "\\boxed{3}"),
                                      ("Level 5", "x = \\boxed{(1,2)}")]):
        (math_dir / f"{i}.json").write_text(json.dumps({"problem": f"P{i}", "level": level, "solution": sol}))
    problems = read_source(tmp_path / "MATH")
    assert [(p.question, p.answer, p.level) for p in problems] == [
        ("P0", "\\frac{1}{2}", 3), ("P1", "3", 1), ("P2", "(1,2)", 5)]
    assert qwen_row(problems[0])["prompt"].endswith("P0\nPlease reason step by step, and put your final answer "
                                                    "within \\boxed{{}}.<|im_end|>\n<|im_start|>assistant\n")
    assert chat_row(problems[2])["label"] == "(1,2)"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "q", "solution": "s", "level": "Level 3"}) + "\n")
    with pytest.raises(ValueError, match=f"{bad}:1"):
        read_source(bad)


def test_countdown_tasks_are_solvable_and_checked():
    rng = random.Random(0)
    for _ in range(200):
        task = countdown_task(rng)
        assert check_countdown(task["solution"], task["numbers"], task["target"])
        assert 1 <= task["target"] <= 999 and 3 <= len(task["numbers"]) <= 4
    assert check_countdown("(1 + 2) * 3", [3, 2, 1], 9)
    assert not check_countdown("(1 + 2) * 3", [3, 2, 1], 10)       # wrong value
    assert not check_countdown("(1 + 2) * 3 * 1", [3, 2, 1], 9)   # 1 used twice
    assert not check_countdown("1 + 2", [3, 2, 1], 3)             # 3 unused
    assert not check_countdown("__import__('os')", [1], 1)        # no calls
    assert check_countdown("6 / 4 * 2", [6, 4, 2], 3)             # exact rational arithmetic
    label = json.dumps({"target": 9, "numbers": [1, 2, 3]})
    assert score_countdown("so \\boxed{(1 + 2) \\times 3}", label)
    assert not score_countdown("so \\boxed{1 + 2 + 3}", label)


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
