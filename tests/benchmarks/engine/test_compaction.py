"""benchmarks.engine.compaction on a tiny shape on a CPU: both tables print every algorithm and
stage, and the per-event table's chunk counts follow the compressor's sizing. Timings are not
checked, only that they are there."""

from __future__ import annotations

import re

ALGOS = ("rkv", "snapkv", "streamingllm")


def test_tiny_cpu_run_prints_stages_and_event_costs(run_benchmark):
    proc = run_benchmark("engine.compaction", "--requests", "3", "--layers", "2", "--budget", "16",
                         "--divide-length", "8", "--repeats", "1", "--warmup", "1", timeout=300)
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ")]
    stages = [(r[0].strip(), r[1].strip()) for r in rows if len(r) == 3 and r[0].strip() in ALGOS]
    assert stages == [(a, s) for a in ALGOS for s in ("gather", "score", "select", "compact", "total")]
    events = {r[0].strip(): r[1:] for r in rows if len(r) == 5 and r[0].strip() in ALGOS}
    assert list(events) == list(ALGOS)
    for chunks, ops, syncs, host_ms in events.values():
        assert re.fullmatch(r"1 \(1\)", chunks.strip())  # 3 small requests: one chunk anywhere
        assert int(ops) > 0 and syncs.strip() == "-" and float(host_ms) > 0
    assert int(events["streamingllm"][1]) < int(events["rkv"][1])  # no key gather, no scoring
