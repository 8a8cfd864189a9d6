"""eval.sh fails in one line on a missing benchmark file (before probing the server) and on an
abbreviated flag; the message names the path and where the sets are looked up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _eval_sh(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "evaluation" / "eval.sh"), *args,
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=120)


def test_missing_eval_set_is_one_line_before_the_server(tmp_path):
    # port 1: nothing listens; the data is checked first, so the message is about the file
    r = _eval_sh("--url", "http://127.0.0.1:1", "--benchmarks", "math500", "--data-dir",
                 str(tmp_path / "none"), tmp_path=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert f"{tmp_path / 'none' / 'math500' / 'test.jsonl'} not found" in lines[0]
    assert "--data-dir, else $SPARSE_RL_EVAL_DATA, else ../shared/data/eval" in lines[0]


def test_readme_states_the_same_lookup_as_the_error():
    readme = (ROOT / "evaluation" / "README.md").read_text()
    assert "`--data-dir`, else `$SPARSE_RL_EVAL_DATA`, else" in readme
    assert "`../shared/data/eval` beside the checkout" in readme


def test_abbreviated_flag_is_refused(tmp_path):
    r = _eval_sh("--url", "http://127.0.0.1:1", "--bench", "math500", tmp_path=tmp_path)
    assert r.returncode == 2 and "unrecognized arguments: --bench" in r.stderr
