"""benchmarks/plots/async_runs.py: the speed-up by the sum of step times after --skip, against
hand-computed values, and the plot written."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.plots import async_runs


def _write(path: Path, times: list[float], rewards: list[float]) -> Path:
    rows = [{"step": i + 1, "time_total": t, "reward_mean": r} for i, (t, r) in
            enumerate(zip(times, rewards))]
    rows.insert(1, {"step": 1, "eval/x/accuracy": 0.5})  # an eval-only row: not a step
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_speed_by_sum_after_skip_and_plot(tmp_path, capsys):
    sync = _write(tmp_path / "s.jsonl", [9.0, 3.0, 3.0, 4.0], [0.1, 0.2, 0.3, 0.4])
    fast = _write(tmp_path / "a.jsonl", [9.0, 2.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.5])
    out = tmp_path / "p.png"
    async_runs.main([f"sync={sync}", f"async={fast}", "--skip", "1", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    sync_line = next(x for x in lines if x.startswith("sync "))
    async_line = next(x for x in lines if x.startswith("async "))
    assert "10.0" in sync_line and "1.00x" in sync_line  # 3 + 3 + 4 after the first
    assert " 5.0" in async_line and "2.00x" in async_line  # 10 / 5
    assert "2.00 " in async_line.split()[2] + " "  # median of 2, 2, 1
    assert "0.150 -> 0.400" in async_line  # first 2 (k = 4 // 2) -> last 2 rewards
    assert out.stat().st_size > 0
