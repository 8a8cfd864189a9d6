"""Issue 60's speed lane: ``studies/speed_lane_summary.py`` turns the pieces' JSON into the
tables (hand made inputs, hand computed ratios), salvages a long-rollout piece cut at its limit,
names an OOM; and ``studies/speed_lane.sh`` runs end to end on a CPU with tiny shapes
(``SMOKE=1``, launch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import speed_lane_summary as summary

ROOT = Path(__file__).resolve().parents[3]


def spread(lo, mid, hi):
    return {"min": lo, "median": mid, "max": hi}


def write_pieces(out: Path, pieces: list[dict]) -> None:
    (out / "pieces.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pieces))


def phase_summary(total: float, rollout: float) -> dict:
    """A training/rl_step.py summary with the phases studies/long_rollout.py's row reads."""
    rest = total - rollout
    return {"total_s": spread(total - 1, total, total + 1), "rollout_s": spread(rollout, rollout, rollout),
            "recompute_s": spread(rest / 2, rest / 2, rest / 2), "update_s": spread(rest / 2, rest / 2, rest / 2),
            "sync_s": spread(0.03, 0.03, 0.03)}


def test_summary_tables(tmp_path):
    write_pieces(tmp_path, [
        {"piece": "ril_dense", "exit": 0, "seconds": 80, "limit_s": 150, "command": ["x.py"]},
        {"piece": "oom_3b", "exit": 1, "seconds": 60, "limit_s": 170, "command": ["y.py"]},
        {"piece": "replay", "exit": 0, "seconds": 70, "limit_s": 120, "command": ["z.py"]},
        {"piece": "long8k", "skipped": True}])
    (tmp_path / "ril_dense.json").write_text(json.dumps({
        "shape": "qwen2.5-0.5b", "max_tokens_per_gpu": 32768, "in_loop_over_isolated": 0.8,
        "in_loop": {"rollout_tokens_per_s": spread(70e3, 80e3, 90e3), "decode_s": spread(2, 2, 2),
                    "time_total": spread(9, 9.5, 10), "graph_captures": spread(1, 1, 1)},
        "isolated": {"tokens_per_s": spread(99e3, 100e3, 101e3)},
        "in_loop_hbm": {"decode_hbm_tb_s": 1.2, "decode_hbm_fraction": 0.25}}))
    (tmp_path / "oom_3b.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n")
    # flex: 1.5x dense on the recompute, 1.3x on the update -> not within 1.2x; the mask path
    # timed beside it gets its own row
    (tmp_path / "replay.json").write_text(json.dumps({
        "sparse_impls": ["flex", "mask"], "recompute_time_ratio": 1.5, "update_time_ratio": 1.3,
        "rollout_time_ratio": 1.4, "mask_recompute_time_ratio": 1.1,
        "mask_update_time_ratio": 1.15, "mask_rollout_time_ratio": 1.12}))
    text = summary.main([str(tmp_path), "--lane-seconds", "500"]).read_text()
    assert "| ril_dense | qwen2.5-0.5b | 32768 |" in text
    assert "`oom_3b`: exit 1, **OOM**" in text
    assert "| dense | 70,000 / 80,000 / 90,000 | 99,000 / 1e+05 / 1.01e+05 | 0.8 | 1.20 TB/s (25%)" in text
    assert "| graph_captures | 1 |" in text
    assert "`long8k`: skipped" in text
    assert "| flex | 1.5 | 1.3 | 1.4 |" in text and "| mask | 1.1 | 1.15 | 1.12 |" in text
    assert "**flex** <= 1.2x dense on recompute and update: no (rollout ratio 1.4)." in text


def test_a_cut_long_rollout_piece_keeps_its_finished_configs(tmp_path):
    """long4k cut at its limit after dense and R-KV: their own JSONs give the rows, the R-KV
    speed-ups against that dense row (20 / 10 = 2x the step, 12 / 4 = 3x the rollout)."""
    cmd = ["-m", "benchmarks.studies.long_rollout", "--response-len", "4096", "--configs", "dense",
           "rkv:512", "dense@fp8_e4m3", "--workdir", "w", "--json", "j"]
    write_pieces(tmp_path, [{"piece": "long4k", "exit": 124, "seconds": 330, "limit_s": 330,
                             "command": cmd}])
    runs = tmp_path / "long_runs"
    runs.mkdir()
    (runs / "dense_4096.json").write_text(json.dumps({"summary": phase_summary(20.0, 12.0)}))
    (runs / "rkv_512_4096.json").write_text(json.dumps({"summary": phase_summary(10.0, 4.0)}))
    text = summary.main([str(tmp_path)]).read_text()
    assert "`long4k`: exit 124 (cut at its limit)" in text
    assert "| 4096 | dense | 19 / 20 / 21 | - | 12 |" in text
    rkv = next(line for line in text.splitlines() if line.startswith("| 4096 | rkv:512 |"))
    assert rkv.split(" | ")[-3:] == ["2", "3", "- |"], rkv
    assert "| 4096 | dense@fp8_e4m3 |" not in text  # cut before it ran


def test_weights_table(tmp_path):
    """engine/weight_sync.py's pieces: one row per shape and mode, the push's spread, its phases;
    a piece that failed is named."""
    write_pieces(tmp_path, [
        {"piece": "weights_smollm2", "exit": 0, "seconds": 60, "limit_s": 150, "command": ["w.py"]},
        {"piece": "weights_3b", "exit": 124, "seconds": 300, "limit_s": 300, "command": ["w.py"]}])
    (tmp_path / "weights_smollm2.json").write_text(json.dumps({"shape": "smollm2-135m", "modes": {
        "distributed": {"transport": "NCCL, server on GPU 1", "min_s": 0.05, "median_s": 0.06,
                        "max_s": 0.08, "gb_per_s": 4.5,
                        "phases_s": {"export": 0.001, "flatten": 0.002, "transfer": 0.05}}}}))
    text = summary.main([str(tmp_path)]).read_text()
    assert ("| smollm2-135m | distributed | NCCL, server on GPU 1 | 0.05 / 0.06 / 0.08 | 4.5 "
            "| export 0.001, flatten 0.002, transfer 0.050 |") in text
    assert "`weights_3b`: exit 124 (cut at its limit)" in text


def test_decode4k_table(tmp_path):
    """studies/rollout_split.py's JSON: one row per config with each part's share of the wall
    (hand computed: 10 s wall, 0.5 s prefill = 5%, 9 s decode = 90%, 0.2 s assembly = 2%), the
    compression events, the captures, and the kernel tables it wrote."""
    write_pieces(tmp_path, [{"piece": "decode4k", "exit": 0, "seconds": 150, "limit_s": 240,
                             "command": ["-m", "benchmarks.studies.rollout_split"]}])
    ms = lambda v: {"min": v, "median": v, "max": v, "sum": v, "count": 1}  # noqa: E731
    rollout = {"wall_s": 10.0, "prefill_s": 0.5, "prefill_steps": 2, "decode_steps": 4095,
               "decode_s": 9.0, "step_ms": ms(2.2), "host_ms_per_step": ms(0.5),
               "gpu_wait_ms_per_step": ms(1.7), "graph_gpu_ms_per_step": ms(2.1),
               "compression": {"events": 31, "host_s": ms(0.09), "gpu_span_ms": ms(40.0)},
               "assembly_s": 0.2, "last_step_to_dicts_s": 0.05, "dicts_to_generations_s": 0.15,
               "other_s": 0.3, "preemptions": 0, "graph_captures": 0, "gc": {"total_s": 0.04},
               "by_batch": [{"batch": "193-256", "steps": 900, "step_ms": 2.5, "host_ms": 0.6,
                             "graph_gpu_ms": 2.4}]}
    (tmp_path / "decode4k.json").write_text(json.dumps({
        "device": "NVIDIA H200", "shape": "qwen2.5-0.5b", "prompts": 32, "samples": 8,
        "response_len": 4096, "configs": {"rkv:512": {
            "rollout": rollout, "warmup_graph_captures": 1, "graphs_engine_life": {"captures": 1}}}}))
    (tmp_path / "decode4k_profile").mkdir()
    (tmp_path / "decode4k_profile" / "rkv_512_decode_kernels.txt").write_text("Name  CUDA total\nk  1ms\n")
    text = summary.main([str(tmp_path)]).read_text()
    assert ("| rkv:512 | 10.00 | 0.50 (5%) (2) | 4095 | 9.00 (90%) | 2.200 / 0.500 / 1.700 / 2.100 "
            "| 31, 0.090, 40.0 | 0.20 (2%) (0.050, 0.150) | 0.040 | 0.30 (3%) | 0 | 1 / 0 / 1 |") in text
    assert "| rkv:512 | 193-256 | 900 | 2.500 | 0.600 | 2.400 |" in text
    assert "`decode4k_profile/rkv_512_decode_kernels.txt`:" in text and "k  1ms" in text


@pytest.mark.launch  # the lane through its shell script on a CPU, tiny shapes: ~3 min on 2 idle cores
def test_lane_smoke(tmp_path):
    env = {**os.environ, "SMOKE": "1", "PARTS": "decode4k ril_dense long4k weights_smollm2",
           "PYTHON": sys.executable,
           "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "lane"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "studies" / "speed_lane.sh"), str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pieces = [json.loads(line) for line in (out / "pieces.jsonl").read_text().splitlines()]
    assert [(p["piece"], p["exit"]) for p in pieces] == [("decode4k", 0), ("ril_dense", 0),
                                                         ("long4k", 0), ("weights_smollm2", 0)]
    split = json.loads((out / "decode4k.json").read_text())["configs"]
    assert list(split) == ["dense", "rkv:16"] and split["rkv:16"]["rollout"]["compression"]["events"] > 0
    assert (out / "decode4k_profile" / "rkv_16_compression_kernels.txt").exists()
    ril = json.loads((out / "ril_dense.json").read_text())
    assert ril["max_tokens_per_gpu"] > 0 and ril["in_loop_over_isolated"] > 0
    assert ril["in_loop"]["decode_steps"]["median"] > 0
    rows = json.loads((out / "long4k.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["dense", "dense+s1", "rkv:512+s1"]
    assert all("error" not in r for r in rows)
    # off-policy: at least --stale-steps 3 timed steps, and its ratio to dense+s1
    assert [len(r["steps_s"]) for r in rows] == [2, 3, 3] and "step_speedup_vs_s1" in rows[2]
    weights = json.loads((out / "weights_smollm2.json").read_text())["modes"]
    assert set(weights) == {"auto", "distributed", "ipc", "disk", "tensor"}
    assert all(row["verified"] for row in weights.values())
    assert weights["auto"]["mode_used"] == "tensor"  # a CPU: auto is tensors over HTTP
    text = (out / "summary.md").read_text()
    assert "| rkv:16 |" in text and "| ril_dense | tiny |" in text and "| 64 | rkv:512+s1 |" in text
    assert "| tiny | distributed | gloo |" in text
    assert not (out / "work").exists()  # checkpoints removed, results kept


def test_a_long_piece_cut_with_its_json_shows_its_rows_and_the_cut(tmp_path):
    """long_rollout writes its JSON on SIGTERM: the rows (the cut config's timed steps, its
    error) and the piece's exit both show; steady state and every timed step in the table."""
    write_pieces(tmp_path, [{"piece": "long4k", "exit": 124, "seconds": 480, "limit_s": 480,
                             "command": ["-m", "benchmarks.studies.long_rollout"]}])
    rows = [{"config": "dense", "response_len": 4096, "step_s": 20.0, "rollout_s": 14.0,
             "steps_s": [22.0, 20.0], "spread": {"total_s": spread(20.0, 20.0, 20.0)}},
            {"config": "rkv:512+s1", "response_len": 4096, "step_s": 16.0, "rollout_s": 0.01,
             "steps_s": [15.0, 17.0, 16.0], "spread": {"total_s": spread(16.0, 16.5, 17.0)},
             "step_speedup": 1.25, "error": "exit -15 after 3 timed step(s)"}]
    (tmp_path / "long4k.json").write_text(json.dumps({"partial": True, "rows": rows}))
    text = summary.main([str(tmp_path)]).read_text()
    assert "`long4k`: exit 124 (cut at its limit)" in text
    assert "| 4096 | dense | 20 / 20 / 20 | 22, 20 | 14 |" in text
    assert "| 4096 | rkv:512+s1 | 16 / 16.5 / 17 | 15, 17, 16 | 0.01 |" in text
