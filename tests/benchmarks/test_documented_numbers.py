"""The tables of ``docs/benchmarks.md`` that cite ``docs/data/`` hold what their raw files hold:
cells recomputed from the committed JSONs and formatted as the doc writes them, every row of
each sampled table (the two-GPU layouts, the four-GPU and dense layouts, the inference frontier,
the replay tile count). A number edited by hand, a rounding slip or a row with no raw file fails
here. Mutation checks: the frontier's R-KV 192 response length back at 283 (the JSON holds
282.45), any layout's median changed by 0.01, or a GPU-busy figure put back into call 3 (whose
``nvidia-smi`` samples were not kept) each fail."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
DATA = ROOT / "docs" / "data"


def table_after(marker: str) -> list[dict[str, str]]:
    """The first Markdown table after the line that contains ``marker``: one dict per row,
    header -> cell (bold marks stripped)."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]
    assert all(len(r) == len(header) for r in body), marker
    return [dict(zip(header, r)) for r in body]


def _load(path: Path):
    return json.loads(path.read_text())


def _steps(xs) -> str:
    return " / ".join(f"{x:.1f}" for x in xs)


def _thousands(x: float) -> str:
    return f"{x:,.0f}"


def _busy(values) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


# --- two GPUs, 2026-11-25 ---------------------------------------------------------------------

LAYOUTS_1125 = {1: ["1gpu-sync", "coloc-dp2-sync", "disagg-s1"],
                2: ["1gpu-sync", "coloc-tp2-sync", "disagg-sync", "coloc-dp2-s1-proc"],
                3: ["1gpu-sync", "disagg-s1-fullgpu", "disagg-s2-fullgpu"],
                4: ["disagg-s1-partial-fullgpu"]}  # call 4: call 3's machine, its 1-GPU run


def _run_1125(call: int, layout: str) -> dict:
    """One run's numbers from its bench_rl_step JSON (medians over the measured steps)."""
    steps = _load(DATA / "layouts-2026-11-25" / f"call{call}-rkv_512-{layout}.json")["steps"]
    med = lambda k: statistics.median(s[k] for s in steps)  # noqa: E731
    return dict(steps=[s["total_s"] for s in steps], median=med("total_s"),
                rollout=med("rollout_s"), recompute=med("recompute_s"), update=med("update_s"),
                tokens=med("rollout_tokens_per_s"), aborted=med("aborted"))


def _busy_1125(call: int, layout: str) -> str:
    """The GPU-busy column: from the call's summary JSON; '-' where none was kept (call 3)."""
    summary = DATA / "layouts-2026-11-25" / f"call{call}-layouts.json"
    if not summary.exists():
        return "-"
    row = next(r for r in _load(summary) if r["layout"] == layout)
    return _busy(row["gpu_busy"].values())


def test_two_gpu_layouts_2026_11_25():
    rows = table_after("| call | layout | GPUs | steps s |")
    keys = [(call, layout) for call, names in LAYOUTS_1125.items() for layout in names]
    assert [int(r["call"]) for r in rows] == [call for call, _ in keys]
    for row, (call, layout) in zip(rows, keys):
        run = _run_1125(call, layout)
        base = _run_1125(3 if call == 4 else call, "1gpu-sync")
        want = {"steps s": _steps(run["steps"]), "median s": f"{run['median']:.2f}",
                "vs 1-GPU sync, median": f"{base['median'] / run['median']:.2f}x",
                "by the sum": f"{sum(base['steps']) / sum(run['steps']):.2f}x",
                "rollout wait s": f"{run['rollout']:.2f}", "recompute s": f"{run['recompute']:.2f}",
                "update s": f"{run['update']:.2f}", "gen tok/s": _thousands(run["tokens"]),
                "GPU busy % (0 / 1)": _busy_1125(call, layout), "aborted": f"{run['aborted']:.0f}"}
        assert {k: row[k] for k in want} == want, (call, layout)


# --- four GPUs and dense rollouts, 2026-11-26 -------------------------------------------------

def _layouts_1126(name: str) -> dict:
    return {r["layout"]: r for r in _load(DATA / "layouts-2026-11-26" / name)}


def _common_1126(r: dict) -> dict:
    """Cells both 2026-11-26 layout tables hold: GPU busy over the run's own GPUs only."""
    return {"steps s": _steps(r["step_s"]), "median": f"{r['step_median_s']:.2f}",
            "rollout wait s": f"{r['rollout_s']:.2f}",
            "GPU busy %": _busy(list(r["gpu_busy"].values())[:r["gpus"]]),
            "aborted": f"{r['aborted']:.0f}", "GPUs": str(r["gpus"])}


@pytest.mark.parametrize("marker,raw,layouts,extra", [
    ("**Four GPUs: the rollout's weak scaling**", "layouts4_layouts.json",
     ["1gpu-sync", "coloc-dp4-sync", "disagg-2x2-s1-fullgpu"],
     lambda r: {"prompts": str(r["prompts"]),
                # samples per hour against one GPU's: steps per hour x the batch's prompts
                "samples/h vs 1-GPU sync": f"{r['vs_1gpu_median'] * r['prompts'] / 32:.2f}x"}),
    ("**Dense rollouts, long-tailed 0.5B shape at 4,096**", "layouts-dense_layouts.json",
     ["1gpu-sync", "disagg-s1-fullgpu"],
     lambda r: {"vs 1-GPU sync": f"{r['vs_1gpu_median']:.2f}x",
                "recompute s": f"{r['recompute_s']:.2f}", "update s": f"{r['update_s']:.2f}",
                "gen tok/s": _thousands(r["tokens_per_s"])}),
])
def test_layouts_2026_11_26(marker, raw, layouts, extra):
    rows, runs = table_after(marker), _layouts_1126(raw)
    assert len(rows) == len(layouts)
    for row, layout in zip(rows, layouts):
        want = {**_common_1126(runs[layout]), **extra(runs[layout])}
        assert {k: row[k] for k in want} == want, layout


# --- the inference frontier -------------------------------------------------------------------

_ALGORITHMS = {"dense": "dense", "R-KV": "rkv", "SnapKV": "snapkv"}
_PROMPTS = {"-": None, "compressed": "compress", "kept": "keep"}


def _frontier_rows() -> dict:
    folder = DATA / "frontier-cpu-2026-11-26"
    rows = {}
    for name in ("frontier.json", "frontier_keep_32_64.json"):
        for r in _load(folder / name)["rows"]:
            rows.setdefault((r["algorithm"], r["budget"], r["prompt"]), r)
    return rows


def test_inference_frontier_table():
    raw = _frontier_rows()
    rows = table_after("| algorithm | budget | prompt | accuracy ± s.e. |")
    assert len(rows) == len(raw)
    for row in rows:
        budget = None if row["budget"] == "-" else int(row["budget"])
        r = raw[(_ALGORITHMS[row["algorithm"]], budget, _PROMPTS[row["prompt"]])]
        want = {"accuracy ± s.e.": f"{r['accuracy']:.3f} ± {r['se']:.3f}",
                "of dense": f"{100 * r['of_dense']:.0f}%",
                "pool peak of dense's": f"{r['pool_fraction']:.2f}",
                "mean response tokens": f"{r['response_len']:.0f}"}
        assert {k: row[k] for k in want} == want, row


# --- replay tiles -----------------------------------------------------------------------------

_TILE_ROWS = {"dense causal": "dense", "replay, `flex`": "flex",
              "slots in position order": "gather_position_order", "the default": "gather"}


def test_replay_tile_table():
    work = _load(DATA / "issue42-2026-11-26" / "replay_tiles.json")["tile_work"]
    rows = table_after("| attention | partial tiles (element mask) |")
    assert len(rows) == len(_TILE_ROWS)
    for row in rows:
        name = next(v for k, v in _TILE_ROWS.items() if k in row["attention"])
        t = work[name]
        want = {"partial tiles (element mask)": _thousands(t["partial"]),
                "full tiles": _thousands(t["full"]), "total": _thousands(t["total"]),
                "of dense's": f"{t['total'] / work['dense']['total']:.2f}"}
        assert {k: row[k] for k in want} == want, name


def test_the_table_reader_reads_cells_and_stops_at_the_table_end():
    rows = table_after("| call | layout | GPUs | steps s |")
    assert rows[1]["layout"] == "colocated DP 2 sync" and rows[1]["vs 1-GPU sync, median"] == "1.84x"
    assert len(rows) == sum(len(v) for v in LAYOUTS_1125.values())
