"""Stacked step time of saved long-rollout runs (training/rl_step.py JSONs named
``<algorithm>_<budget>_<cap>[_<tag>].json`` or ``dense_<cap>[_<tag>].json``), one panel per
response cap and KV pool, with speed-ups against the dense run of the same panel.

    python -m benchmarks.plots.long_rollout docs/data/long_rollout --out docs/plots/long_rollout.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.studies.long_rollout import plot, print_rows, row


def config_of(path: Path) -> dict | None:
    parts = path.stem.split("_")
    if parts[0] == "dense":
        return {"name": "dense", "compress": "none"}
    if parts[0] in ("rkv", "snapkv", "streamingllm") and len(parts) >= 3:
        return {"name": f"{parts[0]}:{parts[1]}", "compress": parts[0]}
    return None


def load_rows(folder: Path) -> list[dict]:
    runs = [(config_of(p), json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
    runs = [(c, d) for c, d in runs if c and "summary" in d]
    rows = [row(c, d["response_len"], d["summary"], None) for c, d in runs]
    for r in rows:  # speed-ups against the dense run in the same pool at the same cap
        dense = next((d for d in rows if d["config"] == "dense" and d["response_len"] == r["response_len"]
                      and round(d["pool_gib"], 1) == round(r["pool_gib"], 1)), None)
        if dense and r is not dense:
            r["step_speedup"] = dense["step_s"] / r["step_s"]
            r["rollout_speedup"] = dense["rollout_s"] / r["rollout_s"]
    return sorted(rows, key=lambda r: (r["response_len"], round(r["pool_gib"], 1), r["config"] != "dense", r["config"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = load_rows(Path(args.folder))
    if not rows:
        raise SystemExit(f"{args.folder}: no rl_step JSONs named as the docstring says")
    print_rows(rows)
    plot(rows, Path(args.out))


if __name__ == "__main__":
    main()
