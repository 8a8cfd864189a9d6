"""``summary.md`` of a ``speed_lane.sh`` output folder: the pieces' JSON as issue 60's tables.

    python -m benchmarks.studies.speed_lane_summary OUT_DIR [--parts ...] [--lane-seconds S]

Every ratio is taken within the lane's one call. A piece that failed or was cut shows its exit
status and the last lines of its log instead of numbers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

OOM_MARKERS = ("out of memory", "OutOfMemoryError")


def load(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pieces(out: Path) -> dict[str, dict]:
    path = out / "pieces.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {p["piece"]: p for p in map(json.loads, filter(None, lines))}


def fmt(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}g}"
    return str(v)


def mmm(spread: dict | None, digits: int = 4) -> str:
    """min / median / max of a ``{"min", "median", "max"}`` dict."""
    if not spread:
        return "-"
    return " / ".join(fmt(float(spread[k]), digits) for k in ("min", "median", "max"))


def failure(out: Path, name: str, info: dict | None) -> str:
    if info is None:
        return f"- `{name}`: not run"
    if info.get("skipped"):
        return f"- `{name}`: skipped (lane time spent)"
    log = out / f"{name}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    oom = any(m in text for m in OOM_MARKERS)
    tail = [ln for ln in text.splitlines() if "warn" not in ln.lower()][-6:]
    cut = " (cut at its limit)" if info.get("exit") in (124, 137) else ""
    return (f"- `{name}`: exit {info.get('exit')}{cut}{', **OOM**' if oom else ''} after "
            f"{info.get('seconds')} s; log tail:\n\n```\n" + "\n".join(tail) + "\n```")


def header(out: Path, args, runs: dict) -> list[str]:
    gpu = (out / "gpu.txt").read_text().strip().splitlines()[1:] if (out / "gpu.txt").exists() else []
    lines = [f"# Speed lane (issue 60): {time.strftime('%Y-%m-%d', time.gmtime())}", "",
             f"- GPU: {gpu[0] if gpu else 'none (nvidia-smi absent: CPU smoke run)'}",
             f"- command: `PARTS=\"{' '.join(args.parts)}\" bash benchmarks/studies/speed_lane.sh OUT`"
             f" ({args.lane_seconds} s wall)", "",
             "| piece | exit | seconds | limit s | command |", "|---|---:|---:|---:|---|"]
    for name in args.parts:
        p = runs.get(name, {})
        cmd = " ".join(p.get("command", [])).replace(str(out), "OUT")
        lines.append(f"| {name} | {fmt(p.get('exit', 'skipped' if p.get('skipped') else '-'))} "
                     f"| {fmt(p.get('seconds'))} | {fmt(p.get('limit_s'))} | `{cmd}` |")
    return lines + [""]


def micro_batch_section(out: Path, runs: dict) -> list[str]:
    lines = ["## 1. The memory-sized micro-batch (no `--max-tokens-per-gpu`)", "",
             "| piece | shape | micro-batch tokens (sized) | peak reserved GiB (min / median / max) "
             "| step s (min / median / max) | OOM |", "|---|---|---:|---|---|---|"]
    notes = []
    for name in ("ril_dense", "ril_rkv", "oom_1.5b", "oom_3b"):
        r, info = load(out, name), runs.get(name)
        if r is None:
            notes.append(failure(out, name, info))
            continue
        spread = r.get("summary") or r.get("in_loop") or {}
        step = spread.get("total_s") or spread.get("time_total")
        lines.append(f"| {name} | {r.get('shape')} | {fmt(r.get('max_tokens_per_gpu'))} "
                     f"| {mmm(spread.get('memory/peak_reserved_gib'))} | {mmm(step)} | no |")
    return lines + [""] + notes + [""]


BREAKDOWN = ("pool_resume_s", "graph_captures", "graph_capture_s", "decode_steps", "decode_s",
             "decode_host_s", "decode_gpu_wait_s", "prefill_and_rest_s", "compression_host_s",
             "schedule_host_s", "output_host_s", "parse_s", "pool_release_s", "outside_engine_s",
             "sync_s")


def rollout_section(out: Path, runs: dict) -> list[str]:
    lines = ["## 2. The rollout in the loop against the engine alone", "",
             "| config | in-loop tok/s (min / median / max) | same requests, engine alone "
             "| in-loop / alone (target >= 0.90) | decode HBM in loop | decode HBM alone "
             "| engine/throughput.py tok/s | its decode-only roofline share |",
             "|---|---|---|---:|---:|---:|---|---:|"]
    notes, rows = [], {}
    for cfg in ("dense", "rkv"):
        r, e = load(out, f"ril_{cfg}"), load(out, f"engine_{cfg}")
        if r is None:
            notes.append(failure(out, f"ril_{cfg}", runs.get(f"ril_{cfg}")))
        if e is None:
            notes.append(failure(out, f"engine_{cfg}", runs.get(f"engine_{cfg}")))
        if r is None and e is None:
            continue
        rows[cfg] = r
        lines.append(f"| {cfg} | {mmm((r or {}).get('in_loop', {}).get('rollout_tokens_per_s'), 5)} "
                     f"| {mmm((r or {}).get('isolated', {}).get('tokens_per_s'), 5)} "
                     f"| {fmt((r or {}).get('in_loop_over_isolated'), 3)} "
                     f"| {_hbm((r or {}).get('in_loop_hbm'))} | {_hbm((r or {}).get('isolated_hbm'))} "
                     f"| {_engine_tok(e)} | {_engine_roof(e)} |")
    lines += ["", "In-loop rollout, median seconds of each piece (module docstring of "
              "`benchmarks/training/rollout_in_loop.py`; host-only pieces overlap the GPU):", "",
              "| piece | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
    for key in BREAKDOWN:
        lines.append(f"| {key} | " + " | ".join(
            fmt((r or {}).get("in_loop", {}).get(key, {}).get("median")) for r in rows.values()) + " |")
    lines.append("| log-prob cost (alone, with - without) | " + " | ".join(
        fmt((r or {}).get("logprob_cost_s")) for r in rows.values()) + " |")
    return lines + [""] + notes + [""]


def _hbm(h: dict | None) -> str:
    if not h:
        return "-"
    frac = h.get("decode_hbm_fraction")
    return f"{h['decode_hbm_tb_s']:.2f} TB/s" + (f" ({100 * frac:.0f}%)" if frac else "")


def _engine_tok(e: dict | None) -> str:
    mode = next(iter((e or {}).get("engine", {}).values()), None)
    return mmm(mode["tok_s"], 5) if mode else "-"


def _engine_roof(e: dict | None) -> str:
    mode = next(iter((e or {}).get("engine", {}).values()), None)
    if not mode or not e.get("roofline"):
        return "-"
    return f"{100 * mode['decode_tok_s']['median'] / e['roofline']['tok_s']:.0f}%"


LONG_COLS = ("step_s", "rollout_s", "recompute_s", "update_s", "sync_s", "rollout_tokens_per_s",
             "preemptions", "step_speedup", "rollout_speedup", "step_speedup_vs_s1")


def long_section(out: Path, runs: dict) -> list[str]:
    lines = ["## 3. The long-rollout step on the fast defaults", "",
             "Targets: R-KV step >= 2x dense at 4k, >= 2.5x at 8k. Steady state: min / median / "
             "max over the timed steps after the first (every timed step listed); speed-ups of "
             "the medians against on-policy bf16 dense of the same call, and for a `+s1` row "
             "(one step off-policy) also against `dense+s1` (`step_speedup_vs_s1`). A `+s1` "
             "rollout column is the step's wait for a rollout generated meanwhile.", "",
             "| cap | config | steady step s (min / median / max) | timed steps s | "
             + " | ".join(LONG_COLS[1:]) + " |",
             "|---:|---|---|---|" + "---:|" * (len(LONG_COLS) - 1)]
    notes = []
    for name in ("long4k", "long8k"):
        r, info = load(out, name), runs.get(name)
        if r is None or (info or {}).get("exit", 0) != 0:
            notes.append(failure(out, name, info))
        if r is None:
            r = salvage_long(out, info)
        for row in r.get("rows", []):
            total = (row.get("spread") or {}).get("total_s")
            steps = ", ".join(fmt(x, 3) for x in row.get("steps_s") or [])
            lines.append(f"| {row.get('response_len')} | {row.get('config')} | "
                         + (mmm(total) if total else fmt(row.get("error"))) + f" | {steps or '-'} | "
                         + " | ".join(fmt(row.get(c), 3) for c in LONG_COLS[1:]) + " |")
    return lines + [""] + notes + [""]


def salvage_long(out: Path, info: dict | None) -> dict:
    """The configs that ran before a long-rollout piece was cut without its own JSON (their
    rl_step JSONs, copied to ``long_runs/``: whole, or the timed steps a cut run made), as
    ``long_rollout`` makes its rows."""
    from benchmarks.studies.long_rollout import add_ratios, config_row, parse_config, run_name

    cmd = (info or {}).get("command", [])
    if "--configs" not in cmd or "--response-len" not in cmd:
        return {}
    cap = int(cmd[cmd.index("--response-len") + 1])
    rows = []
    for spec in cmd[cmd.index("--configs") + 1:]:
        if spec.startswith("--"):
            break
        cfg = parse_config(spec)
        path = out / "long_runs" / f"{run_name(cfg, cap)}.json"
        if path.exists():
            rows.append(config_row(cfg, cap, json.loads(path.read_text())))
    return {"rows": add_ratios(rows)}


def replay_section(out: Path, runs: dict) -> list[str]:
    r = load(out, "replay")
    lines = ["## 4. Replay against dense (flex)", ""]
    if r is None:
        return lines + [failure(out, "replay", runs.get("replay")), ""]
    impls = r.get("sparse_impls", [])
    lines += ["| replay | recompute / dense (time) | update / dense | rollout / dense "
              "| recompute s (min / median / max) | update s |", "|---|---:|---:|---:|---|---|",
              f"| dense | 1 | 1 | 1 | {mmm(r.get('dense_recompute_step_s'))} "
              f"| {mmm(r.get('dense_update_step_s'))} |"]
    verdict = {}
    for i, impl in enumerate(impls):
        mode, prefix = ("sparse", "") if i == 0 else (f"sparse_{impl}", f"{impl}_")
        ratios = [r.get(f"{prefix}{p}_time_ratio") for p in ("recompute", "update", "rollout")]
        verdict[impl] = ratios
        lines.append(f"| {impl} | " + " | ".join(fmt(x, 3) for x in ratios)
                     + f" | {mmm(r.get(f'{mode}_recompute_step_s'))} "
                     f"| {mmm(r.get(f'{mode}_update_step_s'))} |")
    return lines + _replay_verdict(verdict) + [""]


def _replay_verdict(verdict: dict) -> list[str]:
    """Issue 68's target for the first attention timed (the run's: flex on a GPU)."""
    if not verdict:
        return []
    impl, ratios = next(iter(verdict.items()))
    if any(x is None for x in ratios[:2]):
        return []
    within = all(x <= 1.2 for x in ratios[:2])
    return ["", f"**{impl}** <= 1.2x dense on recompute and update: {'yes' if within else 'no'} "
            f"(rollout ratio {fmt(ratios[2], 3)})."]


def decode_section(out: Path, runs: dict) -> list[str]:
    """engine_decode (issue 68): each config's decode step, overlap and sequential."""
    r = load(out, "engine_decode")
    lines = ["## 0. The decode step: dense, R-KV, FP8; overlap on and off (engine/throughput.py)", ""]
    if r is None:
        return lines + [failure(out, "engine_decode", runs.get("engine_decode")), ""] if "engine_decode" in runs else []
    roof = r.get("roofline", {}).get("tok_s")
    lines += ["| config | mode | decode tok/s (median) | of dense roofline | step ms | host ms "
              "| GPU ms (graph) | syncs/step | captures (runs / engine life) | step / dense's |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    configs = r.get("configs", {})
    base = next(iter(configs.values()), {})
    for config, modes in configs.items():
        for mode, e in modes.items():
            med = lambda k: (e.get(k) or {}).get("median")  # noqa: E731
            dense_step = (base.get(mode, {}).get("step_ms") or {}).get("median")
            ratio = med("step_ms") / dense_step if med("step_ms") and dense_step else None
            share = 100 * med("decode_tok_s") / roof if roof and med("decode_tok_s") else None
            lines.append(f"| {config} | {mode} | {_fixed(med('decode_tok_s'), 0)} | {_fixed(share, 1)}% "
                         f"| {_fixed(med('step_ms'), 3)} | {_fixed(med('host_ms_per_step'), 3)} "
                         f"| {_fixed(med('gpu_graph_ms_per_step'), 3)} | {_fixed(e.get('syncs_per_step'), 2)} "
                         f"| {e.get('graph_captures_in_runs')} / {e.get('graph_captures_engine_life')} "
                         f"| {_fixed(ratio, 2)} |")
    return lines + [""]


def decode4k_section(out: Path, runs: dict) -> list[str]:
    """decode4k (studies/rollout_split.py): one 4k rollout's wall split per config, its graph
    captures, and the kernel tables it wrote (OUT/decode4k_profile)."""
    r = load(out, "decode4k")
    lines = ["## 0b. Where a 4k rollout's wall goes (studies/rollout_split.py, one rollout)", ""]
    if r is None:
        return lines + [failure(out, "decode4k", runs.get("decode4k")), ""] if "decode4k" in runs else []
    lines += [f"{r.get('device')}, {r.get('shape')}, {r.get('prompts')} x {r.get('samples')} samples, "
              f"answers up to {r.get('response_len')}; seconds (share of the wall):", "",
              "| config | wall s | prefill (steps) | decode steps | decode s | step / host / GPU-wait / "
              "graph GPU ms (medians) | compressions: events, host s, GPU ms | assembly s (last step -> "
              "dicts, -> Generations) | GC s | other s | preemptions | captures warm-up / timed / life |",
              "|---|---:|---|---:|---|---|---|---|---:|---:|---:|---|"]
    lines += [_split_row(name, c) for name, c in r.get("configs", {}).items()]
    lines += ["", "Decode steps by batch size (medians; a step's time that does not fall with the "
              "batch is a fixed cost):", "", "| config | batch | steps | step ms | host ms | graph GPU ms |",
              "|---|---|---:|---:|---:|---:|"]
    for name, c in r.get("configs", {}).items():
        lines += [f"| {name} | {b['batch']} | {b['steps']} | {_fixed(b['step_ms'], 3)} | "
                  f"{_fixed(b['host_ms'], 3)} | {_fixed(b['graph_gpu_ms'], 3)} |"
                  for b in c.get("rollout", {}).get("by_batch", [])]
    return lines + [""] + _kernel_tables(out) + [""]


def _split_row(name: str, c: dict) -> str:
    r = c.get("rollout", {})
    wall = r.get("wall_s") or float("nan")
    share = lambda s: f"{s:.2f} ({100 * s / wall:.0f}%)"  # noqa: E731
    med = lambda k: _fixed((r.get(k) or {}).get("median"), 3)  # noqa: E731
    comp = r.get("compression")
    comp_s = "-" if comp is None else (f"{comp['events']}, {_fixed((comp.get('host_s') or {}).get('sum'), 3)}, "
                                       f"{_fixed((comp.get('gpu_span_ms') or {}).get('sum'), 1)}")
    life = (c.get("graphs_engine_life") or {}).get("captures", 0)
    return (f"| {name} | {wall:.2f} | {share(r.get('prefill_s', 0))} ({r.get('prefill_steps')}) "
            f"| {r.get('decode_steps')} | {share(r.get('decode_s', 0))} "
            f"| {med('step_ms')} / {med('host_ms_per_step')} / {med('gpu_wait_ms_per_step')} / "
            f"{med('graph_gpu_ms_per_step')} | {comp_s} | {share(r.get('assembly_s', 0))} "
            f"({_fixed(r.get('last_step_to_dicts_s'), 3)}, {_fixed(r.get('dicts_to_generations_s'), 3)}) "
            f"| {_fixed((r.get('gc') or {}).get('total_s'), 3)} | {share(r.get('other_s', 0))} | {r.get('preemptions')} "
            f"| {c.get('warmup_graph_captures')} / {r.get('graph_captures')} / {life} |")


def _kernel_tables(out: Path) -> list[str]:
    """The kernel tables decode4k wrote, each in a block (top 25 by device time)."""
    lines = []
    for path in sorted((out / "decode4k_profile").glob("*_kernels.txt")):
        lines += [f"`decode4k_profile/{path.name}`:", "", "```", path.read_text().rstrip(), "```", ""]
    return lines


def _fixed(v, digits: int) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def weights_section(out: Path, runs: dict) -> list[str]:
    """engine/weight_sync.py's pieces: seconds a push to one server process, by mode."""
    lines = ["## 5. Weights to a server (issue 68)", "",
             "Targets: <= 0.2 s at the SmolLM2-135M shape, <= 2 s at 3B (median of the timed "
             "pushes; phases of that push).", "",
             "| shape | mode | transport | push s (min / median / max) | GB/s | phases s |",
             "|---|---|---|---|---:|---|"]
    notes = []
    for name in ("weights_smollm2", "weights_3b"):
        r = load(out, name)
        if r is None:
            if name in runs:
                notes.append(failure(out, name, runs.get(name)))
            continue
        for mode, row in r.get("modes", {}).items():
            phases = ", ".join(f"{k} {v:.3f}" for k, v in (row.get("phases_s") or {}).items())
            lines.append(f"| {r.get('shape')} | {mode} | {row.get('transport')} | "
                         f"{fmt(row.get('min_s'), 3)} / {fmt(row.get('median_s'), 3)} / "
                         f"{fmt(row.get('max_s'), 3)} | {fmt(row.get('gb_per_s'), 3)} | {phases} |")
    return lines + [""] + notes + [""]


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--parts", nargs="*", default=[])
    p.add_argument("--lane-seconds", type=int, default=None)
    args = p.parse_args(argv)
    out = Path(args.out)
    runs = pieces(out)
    args.parts = args.parts or list(runs)
    text = [*header(out, args, runs), *decode_section(out, runs), *decode4k_section(out, runs),
            *micro_batch_section(out, runs),
            *rollout_section(out, runs), *long_section(out, runs), *replay_section(out, runs),
            *weights_section(out, runs)]
    path = out / "summary.md"
    path.write_text("\n".join(text) + "\n")
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
