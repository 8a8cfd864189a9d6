"""The table of studies/decode_ab.sh: each run's engine/throughput.py JSON, one row per run and
config, side by side (medians over the repeats).

Two JSON layouts: this tree's driver keeps every config under ``configs``; BEFORE_DIR's own
driver (issue 60's) one config per file under ``engine``, named by its ``compress`` flag, and
no step ms of its own (derived here from its decode seconds and steps, as this driver does).

    python -m benchmarks.studies.decode_ab_summary OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RUNS = ("before_own_dense", "before_own_rkv", "before_driver", "after", "after_syncs", "after_notimer")
_CONFIG_NAMES = {"none": "dense"}
HEADER = ("| run | config | tok/s | decode tok/s | step ms | host ms | GPU ms (graph) | GPU wait ms "
          "| syncs/step | kernels/step | GPU busy ms/step (profile) | first ids |")


def _median(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _step_ms(run: dict) -> float | None:
    if run.get("step_ms") is not None:
        return run["step_ms"]
    steps = run.get("decode_steps")
    return 1e3 * run["decode_s"] / steps if steps else None


def configs_of(result: dict) -> dict[str, dict]:
    """config name -> its overlap-mode entry (the run's runs, profile, syncs)."""
    if "configs" in result:
        return {name: modes["overlap"] for name, modes in result["configs"].items() if "overlap" in modes}
    entry = result.get("engine", {}).get("overlap")
    name = _CONFIG_NAMES.get(result.get("compress", ""), result.get("compress", "?"))
    return {name: entry} if entry else {}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row(run: str, config: str, entry: dict) -> str:
    runs = entry["runs"]
    for r in runs:
        r["step_ms"] = _step_ms(r)
    prof = entry.get("profile") or {}
    cells = [run, config, _fmt(_median(runs, "tok_s"), ",.0f"), _fmt(_median(runs, "decode_tok_s"), ",.0f"),
             _fmt(_median(runs, "step_ms"), ".3f"), _fmt(_median(runs, "host_ms_per_step"), ".3f"),
             _fmt(_median(runs, "gpu_graph_ms_per_step"), ".3f"),
             _fmt(_median(runs, "gpu_wait_ms_per_step"), ".3f"), _fmt(entry.get("syncs_per_step"), ".2f"),
             _fmt(prof.get("kernels_per_step", prof.get("torch_ops_per_step")), ".1f"),
             _fmt(prof.get("gpu_busy_ms_per_step"), ".3f"), str(runs[0].get("first_ids", [])[:4])]
    return "| " + " | ".join(cells) + " |"


def table(out: Path) -> list[str]:
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for run in RUNS:
        path = out / f"{run}.json"
        if not path.exists():
            lines.append(f"| {run} | not run or failed (see {run}.log) |" + " |" * (HEADER.count("|") - 3))
            continue
        for config, entry in configs_of(json.loads(path.read_text())).items():
            lines.append(row(run, config, entry))
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="studies/decode_ab.sh's OUT_DIR")
    out = Path(ap.parse_args(argv).out)
    print("# Decode A/B (studies/decode_ab.sh): before = BEFORE_DIR's engine, after = this tree's\n")
    print("\n".join(table(out)))
    print("\nkernels/step: CUDA kernels per decode step (torch ops on a CPU); first ids: the first "
          "request's first tokens (the same weights and seeds give the same tokens when the "
          "step computes the same thing).")


if __name__ == "__main__":
    main()
