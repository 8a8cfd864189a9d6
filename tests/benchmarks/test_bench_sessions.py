"""bench_sessions.py --smoke on the CPU: every reported field is there and the counts that follow
from sessions hold (numbers printed, never timed): a session's later turns prefill only their
observation and the previous turn's last token, dense sessions give the re-prefill tokens
(fp32), and R-KV sessions hold fewer slots than dense ones."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from bench_sessions import main  # noqa: E402


def test_smoke_run_reports_sessions(tmp_path):
    out = main(["--smoke", "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "r.json").is_file()
    a = out["args"]
    rows = {(r["config"], r["way"]): r for r in out["rows"]}
    later = (a["turns"] - 1) * a["samples"] * (a["obs_tokens"] + 1)
    for config in ("dense", "rkv"):
        session, reprefill = rows[config, "session"], rows[config, "reprefill"]
        assert session["prefill_tokens"] == a["samples"] * a["prompt_len"] + later
        assert reprefill["prefill_tokens"] > session["prefill_tokens"]
        assert len(session["turn_s"]) == a["turns"] and session["preemptions"] == 0
    assert rows["dense", "session"]["token_match"] == 1.0
    assert rows["rkv", "session"]["pool_peak"] < rows["dense", "session"]["pool_peak"]
