"""evaluation.prepare_simplelr: the SimpleRL MATH level 3-5 rebuild (exact shared rows, MATH sources)."""

import json
from pathlib import Path

import pytest

from evaluation.prepare_simplelr import chat_row, prepare, qwen_row, read_source

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "train"


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


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed: connection refused


def test_download_offline_is_one_line(tmp_path, monkeypatch, capsys):
    """No network: one line naming --download and --source, no traceback, no half file left.
    Mutation: without the RequestException handler in download() this raises ConnectionError."""
    from evaluation import prepare_simplelr

    url = f"http://127.0.0.1:{_closed_port()}/math.json"
    monkeypatch.setattr(prepare_simplelr, "PUBLIC_SOURCE", url)
    assert prepare_simplelr.main(["--download", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--download: cannot fetch {url} (ConnectionError)" in err[0], err
    assert "--source FILE" in err[0]
    assert not list((tmp_path / "source").glob("*"))


def test_download_offline_cli_through_a_dead_proxy(tmp_path):
    """The real command, with the network cut by a proxy that refuses: one line, exit 2."""
    import os
    import subprocess
    import sys

    proxy = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "https_proxy")}
    env.update(HTTPS_PROXY=proxy, https_proxy=proxy)
    r = subprocess.run([sys.executable, "-m", "evaluation.prepare_simplelr", "--download",
                        "--out-dir", str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: --download: cannot fetch" in lines[0], r.stderr
