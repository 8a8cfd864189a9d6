"""benchmarks.engine.fp8_kv's --smoke run on a CPU: every configuration reports every column, the pools have
the same bytes (FP8: 4x the slots of the smoke run's fp32 pool), and the mismatch columns say
what they should (timings are printed, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.engine.fp8_kv import parse_config

ROOT = Path(__file__).resolve().parents[3]


def test_configs():
    assert parse_config("dense") == {"name": "dense", "kv_dtype": "auto", "compress": None}
    assert parse_config("rkv:512@fp8_e4m3") == {"name": "rkv:512@fp8_e4m3", "kv_dtype": "fp8_e4m3",
                                                "compress": "rkv", "budget": 512, "divide": 128}
    with pytest.raises(SystemExit, match="fp8_e4m3 or fp8_e5m2"):
        parse_config("dense@fp8")


def test_long_rollout_fp8_configs():
    """benchmarks.studies.long_rollout's @fp8 configs: the engine flag and a pool of the same bytes."""
    from argparse import Namespace

    from benchmarks.studies.long_rollout import config_argv, parse_config as long_config

    args = Namespace(prompts=2, samples=4, steps=1, seed=0, max_tokens_per_gpu=2048, dense_fraction=0.5,
                     median_frac=0.5, sigma=0.6, warmup_scale=0.125, extra=[])
    cfg = long_config("rkv:16:8@fp8_e5m2")
    assert cfg == {"name": "rkv:16:8@fp8_e5m2", "compress": "rkv", "budget": 16, "divide": 8,
                   "kv_dtype": "fp8_e5m2"}
    argv = config_argv(args, cfg, 48, Path("hf"), Path("o.json"), Path("w"))
    bf16 = config_argv(args, long_config("rkv:16:8"), 48, Path("hf"), Path("o.json"), Path("w"))
    slots = lambda a: int(a[a.index("--sglang-max-total-tokens") + 1])  # noqa: E731
    assert argv[argv.index("--sglang-kv-cache-dtype") + 1] == "fp8_e5m2"
    assert slots(argv) == 2 * slots(bf16) and "--sglang-kv-cache-dtype" not in bf16
    with pytest.raises(SystemExit):
        long_config("dense@fp16")


@pytest.mark.launch
def test_smoke_run(tmp_path, run_benchmark):
    out = tmp_path / "fp8.json"
    run_benchmark("engine.fp8_kv", "--smoke", "--workdir", str(tmp_path / "w"), "--json", str(out))
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["dense", "dense@fp8_e4m3", "rkv:16:8", "rkv:16:8@fp8_e4m3"]
    dense, fp8, rkv, rkv8 = rows.values()
    for a, b in ((dense, fp8), (rkv, rkv8)):
        assert b["pool_slots"] == 4 * a["pool_slots"] and b["bytes_per_token"] * 4 == a["bytes_per_token"]
        assert abs(b["pool_gib"] / a["pool_gib"] - 1) < 0.01  # the same memory
        assert b["held_vs_bf16"] >= 3.5 and b["rollout_tokens"] == a["rollout_tokens"]
    assert dense["logprob_abs_diff_max"] < 1e-4  # fp32 dense: the recompute is the sampler
    assert 0 < fp8["k3_kl"] < 0.05 and 0 < fp8["ess_token"] <= 1
    assert rkv["k3_kl"] > fp8["k3_kl"]  # compression's gap dwarfs FP8's on the tiny model
