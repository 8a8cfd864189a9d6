"""studies/decode_ab_summary.py: both drivers' JSON layouts (BEFORE_DIR's one config per file
under ``engine``, this tree's ``configs``) side by side, medians and step ms hand computed."""

from __future__ import annotations

import json

from benchmarks.studies import decode_ab_summary as summary


def run(tok_s, decode_s=None, steps=None, step_ms=None, graph_ms=None):
    r = {"tok_s": tok_s, "decode_tok_s": 2 * tok_s, "host_ms_per_step": 0.5, "gpu_wait_ms_per_step": 1.0,
         "first_ids": [7, 8, 9, 10, 11]}
    if decode_s is not None:
        r.update(decode_s=decode_s, decode_steps=steps)
    if step_ms is not None:
        r.update(step_ms=step_ms, gpu_graph_ms_per_step=graph_ms)
    return r


def test_both_layouts_side_by_side(tmp_path):
    # issue 60's driver: no step_ms; 1.0 s over 500 steps and 3.0 s over 500 -> 2 and 6 ms, median 4
    (tmp_path / "before_own_dense.json").write_text(json.dumps({"compress": "none", "engine": {"overlap": {
        "runs": [run(100.0, 1.0, 500), run(300.0, 3.0, 500)]}}}))
    (tmp_path / "after_syncs.json").write_text(json.dumps({"configs": {"rkv": {"overlap": {
        "runs": [run(50.0, step_ms=6.5, graph_ms=6.4)], "syncs_per_step": 0.01,
        "profile": {"kernels_per_step": 812.0, "gpu_busy_ms_per_step": 6.3}}}}}))
    lines = summary.table(tmp_path)
    assert lines[2] == ("| before_own_dense | dense | 200 | 400 | 4.000 | 0.500 | - | 1.000 | - | - | - "
                        "| [7, 8, 9, 10] |")
    assert "| after_syncs | rkv | 50 | 100 | 6.500 | 0.500 | 6.400 | 1.000 | 0.01 | 812.0 | 6.300 |" in lines[-2]
    missing = [line for line in lines if "not run or failed" in line]
    assert [line.split(" | ")[0] for line in missing] == ["| before_own_rkv", "| before_driver", "| after", "| after_notimer"]
    assert all(line.count("|") == lines[0].count("|") for line in lines)
