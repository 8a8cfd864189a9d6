"""benchmarks.engine.decode_tail on the tiny shape on a CPU (eager: no graphs there): the docstring's smoke
command runs, and its JSON and table carry every batch, mode and column. Timings are not
checked, only that they are there and ordered."""

from __future__ import annotations

import json

METRICS = ("step_ms", "host_ms", "replay_ms", "host_outside_replay_ms", "gpu_wait_ms")


def test_tiny_cpu_run_reports_every_batch_and_column(tmp_path, run_benchmark):
    out = tmp_path / "tail.json"
    proc = run_benchmark(
        "engine.decode_tail", "--shape", "tiny", "--device", "cpu", "--batches", "1,3",
        "--prompt-len", "8", "--output-len", "6", "--repeats", "2", "--modes", "overlap,sequential",
        "--breakdown", "--json", str(out), "--model-dir", str(tmp_path / "model"), timeout=300)
    res = json.loads(out.read_text())
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
    assert json.loads(line) == res
    assert res["graphs"] is False and res["weights_read_ms"] is None  # a CPU: eager, no HBM
    assert list(res["batches"]) == ["1", "3"] and res["modes"] == ["overlap", "sequential"]
    for r in res["batches"].values():
        for mode in res["modes"]:
            m = r[mode]
            assert len(m["runs"]) == 2
            assert all(run["decode_steps"] == 5 for run in m["runs"])  # 6 tokens: 1 from prefill
            for key in METRICS:
                assert m[key]["min"] <= m[key]["median"] <= m[key]["max"], key
            assert m["step_ms"]["min"] > 0 and m["replay_ms"]["max"] == 0
            assert {"schedule", "launch", "process outputs", "gpu wait"} <= set(m["breakdown_us"])
    assert "| B | padded to | step ms |" in proc.stdout and "host outside replay ms" in proc.stdout
    assert (tmp_path / "model" / "config.json").is_file()  # kept for the next run
