"""benchmarks.engine.throughput's CPU dry run (``--device cpu --shape tiny``, what
studies/decode_ab.sh's SMOKE runs): every config's runs, the per-step op count of --profile,
and the same tokens whichever config runs first. Timings are not checked, only present."""

from __future__ import annotations

import json

import pytest

B, O = 4, 10


@pytest.mark.slow
def test_cpu_dry_run_reports_every_config(tmp_path, run_benchmark):
    out = tmp_path / "t.json"
    proc = run_benchmark(
        "engine.throughput", "--shape", "tiny", "--device", "cpu", "--batch", str(B),
        "--prompt-len", "8", "--output-len", str(O), "--repeats", "2", "--temperature", "1",
        "--logprobs", "--modes", "overlap", "--configs", "dense,rkv", "--kv-budget", "12",
        "--compress-divide-length", "4", "--count-syncs", "--profile", str(tmp_path / "prof"),
        "--json", str(out), timeout=600)
    res = json.loads(out.read_text())
    assert res["gpu"] == "cpu" and list(res["configs"]) == ["dense", "rkv"]
    first = {}
    for name, modes in res["configs"].items():
        e = modes["overlap"]
        assert [r["tokens"] for r in e["runs"]] == [B * O] * 2
        assert all(r["decode_steps"] == O - 1 for r in e["runs"])  # the first token: prefill's
        assert e["runs"][0]["first_ids"] == e["runs"][1]["first_ids"]  # seeded: the same draw
        assert e["syncs_per_step"] is None and e["graph_captures_engine_life"] == 0  # eager CPU
        assert e["profile"]["torch_ops_per_step"] > 0
        first[name] = e["runs"][0]["first_ids"]
    # the R-KV config compresses (budget 12 < 8 + 10 tokens): it draws other tokens later on,
    # the same first ones (the prompt is never compressed before the first draw)
    assert first["dense"][0] == first["rkv"][0] and first["dense"] != first["rkv"]
    assert "| dense | overlap |" in proc.stdout and "| rkv | overlap |" in proc.stdout
