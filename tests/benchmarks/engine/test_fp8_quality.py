"""fp8_emulation's pieces against hand-computed values, and fp8_quality's --smoke run on a CPU
(its rows say what the CPU investigation of issue 53 found: the engine is its emulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.engine.fp8_emulation import binade_noise, fake_quant, layer_stats

ROOT = Path(__file__).resolve().parents[3]


def test_fake_quant_rounds_saturates_and_scales():
    e4m3 = torch.float8_e4m3fn
    # e4m3 in [1, 2) steps by 1/8: 1.06 -> 1.0, 1.07 -> 1.125 (nearest); 1.0625 ties to even 1.0
    x = torch.tensor([1.06, 1.07, 1.0625, 1000.0, -1000.0])
    assert fake_quant(x, 1.0, e4m3).tolist() == [1.0, 1.125, 1.0, 448.0, -448.0]
    # with scale 4: 4.3 / 4 = 1.075 -> 1.125 -> 4.5; 2000 / 4 = 500 saturates to 448 -> 1792
    assert fake_quant(torch.tensor([4.3, 2000.0]), 4.0, e4m3).tolist() == [4.5, 1792.0]
    # e5m2 in [1, 2) steps by 1/4: 1.3 -> 1.25
    assert fake_quant(torch.tensor([1.3]), 1.0, torch.float8_e5m2).tolist() == [1.25]


def test_binade_noise_stays_within_half_a_step():
    x = torch.tensor([1.0, 1.9, 3.0, -0.3] * 500)
    step = torch.tensor([1.0, 1.0, 2.0, 0.25] * 500) / 8  # e4m3's step at each binade
    d = binade_noise(x, 3, torch.Generator().manual_seed(0)) - x
    assert (d.abs() <= step / 2 + 1e-7).all() and (d.abs() > step / 4).any()


def test_layer_stats_counts_by_hand():
    k = torch.tensor([[[0.001, 1.0, -2.0, 500.0]]])  # [Hkv, T, D]
    v = torch.tensor([[[0.5, 0.5, 0.5, 0.5]]])
    (row,) = layer_stats({0: [(k, v)]}, "fp8_e4m3")
    assert row["k_amax"] == 500.0 and row["v_amax"] == 0.5
    assert row["k_subnormal"] == 0.25 and row["k_saturated"] == 0.25  # 0.001 < 2^-6; 500 > 448
    assert row["scale_amax"] == pytest.approx(500.0 / 448)
    assert row["v_err_scale1"] == 0.0  # 0.5 is an e4m3 value
    assert row["k_err_scale1"] > row["k_err_amax"]  # calibrating removes the saturation


@pytest.mark.launch
def test_smoke_run(tmp_path, run_benchmark):
    out = tmp_path / "q.json"
    run_benchmark("engine.fp8_quality", "--smoke", "--perturb", "--workdir", str(tmp_path / "w"),
                  "--json", str(out))
    res = json.loads(out.read_text())
    rows = {r["config"]: r for r in res["rows"]}
    assert rows["auto"]["vs_dense"]["max_abs"] < 1e-4  # the fp32 engine is the HF model
    for name in ("fp8_e4m3", "fp8_e4m3@amax", "fp8_e5m2"):
        assert rows[name]["vs_emulated"]["mean_abs"] < 3e-3  # the engine is its emulation
        assert rows[name]["emulated_vs_dense"]["mean_abs"] > 3e-3  # and FP8 moved it
    assert rows["fp8_e5m2"]["emulated_vs_dense"]["mean_abs"] > rows["fp8_e4m3"]["emulated_vs_dense"]["mean_abs"]
    bf16, noise = rows["perturb:bfloat16"], rows["perturb:noise"]
    assert bf16["perturbed_vs_dense"]["mean_abs"] < noise["perturbed_vs_dense"]["mean_abs"]
    for layer in res["layer_stats"]["fp8_e4m3"]:
        assert layer["k_saturated"] == 0 and 0.01 < layer["k_err_scale1"] < 0.04
    scales = json.loads((tmp_path / "w" / "scales_fp8_e4m3.json").read_text())
    assert len(scales["kv_cache"]["scaling_factor"]["0"]) == 2  # the tiny model's layers
