"""The tables of ``docs/benchmarks.md`` that cite ``docs/data/`` hold what their raw files hold:
cells recomputed from the committed JSONs and formatted as the doc writes them, every row of
each sampled table: the two-GPU layouts (2026-11-25), the four-GPU and dense layouts
(2026-11-26), the inference frontier, the replay tile count, the long-rollout step (issue 29 and
its 2026-11-25 additions) and async on the long-tailed shape. Where a raw file keeps only 4
significant digits, a cell may be any rounding of the values those digits stand for.

What it found when written (fixed in the doc): the frontier's R-KV 192 response length (283 for
282.45), the issue-29 R-KV 512 step ratio (1.69x for 1.685), call 4's ratio by the sum (2.39x
for 2.384), call 3's GPU-busy figures (no samples kept) and the tile table's position-order row
(no raw file then; the JSON's ``gather_position_order``, from the gather path's tile count, deleted with
that path on 2026-11-29).
Mutation checks: each of those put back fails, and so does a median changed by 0.01 in either
layouts table or a tile count changed by one."""

from __future__ import annotations

import json
import math
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
    """One run's numbers from its benchmarks.training.rl_step JSON (medians over the measured steps)."""
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


# --- the long-rollout step where KV memory binds (issue 29) -----------------------------------

LONG_ROLLOUT_ROWS = [  # the table's rows: (per-run JSON, the dense run it is compared with)
    ("dense_4096_pool10", None), ("rkv_512_4096_pool10", "dense_4096_pool10"),
    ("snapkv_512_4096_pool10", "dense_4096_pool10"), ("dense_4096", None),
    ("rkv_512_4096", "dense_4096"), ("snapkv_512_4096", "dense_4096"),
    ("rkv_1024_4096", "dense_4096"), ("dense_8192", None), ("rkv_1024_8192", "dense_8192")]


def _median_and_range(values, fmt: str) -> str:
    """One step: the value; several: the median and (min-max), as the table writes them."""
    if len(values) == 1:
        return format(values[0], fmt)
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return format(statistics.median(values), fmt) + (f" ({lo}-{hi})" if fmt == ".2f" else "")


def _long_rollout(name: str) -> dict:
    steps = _load(DATA / "long_rollout" / f"{name}.json")["steps"]
    return {k: [s[k] for s in steps] for k in steps[0]}


def test_long_rollout_table_issue_29():
    rows = table_after("| cap | KV pool | config | step s | rollout s |")
    assert len(rows) == len(LONG_ROLLOUT_ROWS)
    for row, (name, dense) in zip(rows, LONG_ROLLOUT_ROWS):
        r = _long_rollout(name)
        med = {k: statistics.median(v) for k, v in r.items()}
        preempted = sorted({f"{x:.0f}" for x in r["rollout_preemptions"]}, key=float)
        want = {"step s": _median_and_range(r["total_s"], ".2f"),
                "rollout s": f"{med['rollout_s']:.2f}", "recompute s": f"{med['recompute_s']:.2f}",
                "update s": f"{med['update_s']:.2f}",
                "rollout tok/s": f"{med['rollout_tokens_per_s'] / 1000:.1f}k",
                "pool peak slots": f"{med['kv_pool_peak_used'] / 1000:.1f}k",
                "preempted": "-".join(preempted),
                "tail share": f"{med['rollout_tail_fraction']:.2f}"}
        if dense is not None:
            d = {k: statistics.median(v) for k, v in _long_rollout(dense).items()}
            want["step vs dense"] = f"{d['total_s'] / med['total_s']:.2f}x"
            want["rollout vs dense"] = f"{d['rollout_s'] / med['rollout_s']:.2f}x"
        assert {k: row[k] for k in want} == want, name


ADDITIONS_1125 = [("dense_1024", None), ("rkv_256_1024", "dense_1024"),
                  ("snapkv_256_1024", "dense_1024"), ("dense_4096_1p5b", None),
                  ("rkv_512_4096_1p5b", "dense_4096_1p5b")]


def test_long_rollout_additions_2026_11_25():
    """These runs kept only their summaries (min / median / max, 4 significant digits)."""
    rows = table_after("| shape | cap | KV pool | config | step s (min-max) |")
    assert len(rows) == len(ADDITIONS_1125)
    for row, (name, dense) in zip(rows, ADDITIONS_1125):
        s = _load(DATA / "long_rollout" / f"{name}.json")["summary"]
        step, pre = s["total_s"], s["rollout_preemptions"]
        ranged = step["min"] != step["max"]
        want = {"step s (min-max)": f"{step['median']:.2f}"
                + (f" ({step['min']:.2f}-{step['max']:.2f})" if ranged else ""),
                "rollout s": f"{s['rollout_s']['median']:.2f}",
                "recompute s": f"{s['recompute_s']['median']:.2f}",
                "update s": f"{s['update_s']['median']:.2f}",
                "rollout tok/s": f"{s['rollout_tokens_per_s']['median'] / 1000:.1f}k",
                "pool peak slots": f"{s['kv_pool_peak_used']['median'] / 1000:.1f}k",
                "preempted": "-".join(dict.fromkeys(f"{pre[k]:.0f}" for k in ("min", "max")))}
        if dense is not None:
            d = _load(DATA / "long_rollout" / f"{dense}.json")["summary"]
            want["step vs dense"] = f"{d['total_s']['median'] / step['median']:.2f}x"
            want["rollout vs dense"] = (f"{d['rollout_s']['median'] / s['rollout_s']['median']:.2f}x")
        assert {k: row[k] for k in want} == want, name


# --- async on the long-tailed 0.5B shape (2026-11-25, sixth session) -------------------------

ASYNC_ROWS = [("l-sync", "l-sync"), ("l-proc2", "l-sync"), ("l-pp", "l-sync"),
              ("u-sync", "u-sync"), ("u-proc", "u-sync")]  # (run, its machine's sync run)


def _async_spread(name: str) -> dict:
    return _load(DATA / "async-2026-11-25c" / f"{name}.json")["rows"][0]["spread"]


def _rounds_to(cell: float, stored: float, decimals: int) -> bool:
    """Whether ``cell`` (``decimals`` places) can be the rounding of the value that ``stored``
    keeps to 4 significant digits (20.45 may have been 20.4507: 20.5)."""
    unit = 10 ** (math.floor(math.log10(abs(stored))) - 3) if stored else 0.0
    return abs(cell - stored) <= 0.5 * 10 ** -decimals + 0.5 * unit + 1e-9


def test_async_long_tailed_table():
    """Three measured steps: their summary's min, median and max are the three steps (the
    order the table lists them in is not kept, so they are compared as a set)."""
    rows = table_after("| machine (call) | mode | steps s | median |")
    assert len(rows) == len(ASYNC_ROWS)
    for row, (name, sync) in zip(rows, ASYNC_ROWS):
        s, base = _async_spread(name), _async_spread(sync)
        steps = [s["total_s"][k] for k in ("min", "median", "max")]
        total = lambda x: sum(x["total_s"].values())  # noqa: E731
        cells = sorted(map(float, row["steps s"].split(" / ")))
        assert all(_rounds_to(c, x, 1) for c, x in zip(cells, steps)), (name, cells, steps)
        want = {"median": f"{steps[1]:.1f}", "sum of 3": f"{sum(steps):.1f}",
                "vs sync, median": f"{base['total_s']['median'] / steps[1]:.2f}x",
                "vs sync, sum": f"{total(base) / total(s):.2f}x"}
        assert {k: row[k] for k in want} == want, name
        tokens = s["rollout_tokens_per_s"]["median"]  # written to 3 significant digits
        assert _rounds_to(float(row["generation tok/s"].replace(",", "")), tokens, -2), name
