"""benchmarks.engine.decode_families: kernel names to families, per-step sums over profiled steps
and each family's HBM floor, against hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.engine.decode_families import family_of, family_table, floors_ms, step_families


@pytest.mark.parametrize("name, family", [
    ("_stage1", "attention"), ("_extend_kernel", "attention"),
    ("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_TNT", "gemm"), ("sm90_xmma_gemm_bf16bf16", "gemm"),
    ("_rmsnorm_kernel", "norm"), ("_silu_mul_kernel", "activation"), ("_rope_kernel", "rope_store"),
    ("_chunk_stats_kernel", "sampling"), ("_draw_kernel", "sampling"),
    ("Memcpy DtoH (Device -> Pinned)", "copies"), ("void at::native::elementwise_kernel", "other"),
])
def test_family_of_names_the_kernels_of_a_decode_step(name, family):
    assert family_of(name) == family


def test_step_families_sums_per_step_largest_first():
    events = [SimpleNamespace(name=n, device_time=us) for n, us in
              [("_stage1", 30.0), ("nvjet_a", 10.0), ("nvjet_b", 14.0), ("_stage1", 50.0),
               ("_rmsnorm_kernel", 4.0)]]
    fam = step_families(events, steps=2)
    assert list(fam) == ["attention", "gemm", "norm"]
    assert fam["attention"] == pytest.approx({"ms": 0.040, "kernels": 1.0})
    assert fam["gemm"] == pytest.approx({"ms": 0.012, "kernels": 1.0})
    assert fam["norm"] == pytest.approx({"ms": 0.002, "kernels": 0.5})


def test_floors_and_table_at_the_bandwidth():
    floors = floors_ms(weight_bytes=4.8e9, kv_bytes=2.4e9, bandwidth=4.8e12)
    assert floors == pytest.approx({"gemm": 1.0, "attention": 0.5})
    fam = {"gemm": {"ms": 3.0, "kernels": 96}, "attention": {"ms": 1.0, "kernels": 24},
           "norm": {"ms": 1.0, "kernels": 48}}
    lines = family_table(fam, floors).splitlines()
    assert lines[2] == "| gemm | 3.000 | 60% | 96 | 1.000 | 3.0 |"
    assert lines[3] == "| attention | 1.000 | 20% | 24 | 0.500 | 2.0 |"
    assert lines[4] == "| norm | 1.000 | 20% | 48 | - | - |"
    assert lines[5] == "| all | 5.000 | 100% | 168 | 1.500 | 3.3 |"
