"""Tables of a torch.profiler run of the multi-turn benchmark (multiturn_probe.profiled).

Written to the profile's folder:
    kernels.txt      top CUDA kernels by self GPU time, whole run (decode replays included)
    cpu_ops.txt      top CPU ops by self CPU time, whole run (engine thread)
    prefill_ops.txt  inside the prefill steps only (``engine_step`` ranges holding a
                     ``prefill_launch:<kind>``), continuation steps then fresh ones: CPU ops by
                     self time with their share of those steps' wall, the Python between ops
                     (``engine_step``'s own time), and the kernels those steps launched
Times are in ms; shares in % of the total named in each table's title.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

TOP = 25


def _self_device_us(avg) -> float:
    for key in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(avg, key, None)
        if value is not None:
            return float(value)
    return 0.0


def _name(evt) -> str:
    # a FunctionEvent has .name, a FunctionEventAvg (key_averages) only .key
    return getattr(evt, "name", None) or evt.key


def _is_kernel(evt) -> bool:
    return "CUDA" in str(getattr(evt, "device_type", "")) and not _name(evt).startswith("cuda")


def table(title: str, rows: list[tuple[str, int, float]], total_ms: float) -> str:
    """rows: (name, calls, ms), already sorted; share of total_ms."""
    lines = [title, f"{'ms':>10} {'share%':>7} {'calls':>7}  name"]
    for name, calls, ms in rows[:TOP]:
        share = 100 * ms / total_ms if total_ms else 0.0
        lines.append(f"{ms:10.3f} {share:7.1f} {calls:7d}  {name[:110]}")
    return "\n".join(lines) + "\n"


def whole_run(averages) -> tuple[list, list]:
    """(kernels, CPU ops) as (name, calls, self ms), largest first."""
    kernels = [(a.key, a.count, _self_device_us(a) / 1e3) for a in averages if _is_kernel(a)]
    ops = [(a.key, a.count, a.self_cpu_time_total / 1e3) for a in averages if not _is_kernel(a)]
    return (sorted(kernels, key=lambda r: -r[2]), sorted(ops, key=lambda r: -r[2]))


def _descendants(evt):
    stack = list(evt.cpu_children)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.cpu_children)


def prefill_steps(events, kind: str) -> list:
    """The engine_step ranges that launched a prefill of `kind` (continuation, fresh)."""
    label = f"prefill_launch:{kind}"
    steps = [e for e in events if e.name == "engine_step"]
    return [s for s in steps if any(d.name == label for d in _descendants(s))]


def _op_name(e, step) -> str:
    """The op's name; the probe's own ranges' self time is the interpreter's, named so."""
    if e is step:
        return "(python between ops: engine_step self)"
    if e.name.startswith("prefill_launch"):
        return "(python in the launch: prefill_launch self)"
    return e.name


def prefill_split(steps) -> tuple[list, list, float]:
    """(CPU ops by self ms, kernels by ms, the steps' summed wall ms) inside prefill steps;
    the steps' own self time is the Python between ops."""
    ops, kernels = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    wall = 0.0
    for s in steps:
        wall += s.cpu_time_total / 1e3
        for e in [s, *_descendants(s)]:
            name = _op_name(e, s)
            ops[name][0] += 1
            ops[name][1] += e.self_cpu_time_total / 1e3
            for k in getattr(e, "kernels", []) or []:
                kernels[k.name][0] += 1
                kernels[k.name][1] += k.duration / 1e3
    rows = lambda d: sorted(((n, c, ms) for n, (c, ms) in d.items()), key=lambda r: -r[2])
    return rows(ops), rows(kernels), wall


def write_tables(prof, out_dir) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kernels, ops = whole_run(prof.key_averages())
    gpu_ms, cpu_ms = sum(r[2] for r in kernels), sum(r[2] for r in ops)
    (out / "kernels.txt").write_text(table(
        f"CUDA kernels by self GPU time (whole run: {gpu_ms:.1f} ms of kernels)", kernels, gpu_ms)
        if kernels else "no CUDA kernels recorded (CPU run)\n")
    (out / "cpu_ops.txt").write_text(table(
        f"CPU ops by self CPU time (whole run, engine thread: {cpu_ms:.1f} ms)", ops, cpu_ms))
    events = prof.events()
    text, summary = "", {}
    for kind in ("continuation", "fresh"):
        section, numbers = kind_tables(prefill_steps(events, kind), kind)
        text += section + "\n"
        summary[kind] = numbers
    (out / "prefill_ops.txt").write_text(text)
    summary["top_kernels"] = [[n, round(ms, 3)] for n, _, ms in kernels[:5]]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def kind_tables(steps, kind: str) -> tuple[str, dict]:
    """The tables of one kind of prefill step, and their numbers for the summary."""
    p_ops, p_kernels, wall = prefill_split(steps)
    p_gpu = sum(r[2] for r in p_kernels)
    text = table(f"{len(steps)} {kind} prefill steps, {wall:.1f} ms of engine-thread wall: CPU "
                 "ops by self time, share of that wall", p_ops, wall)
    text += "\n" + table(f"kernels those steps launched ({p_gpu:.1f} ms of GPU time), share of "
                         "the steps' wall", p_kernels, wall)
    return text, {"steps": len(steps), "wall_ms": wall, "kernel_ms": p_gpu,
                  "top_ops": [[n, round(ms, 3)] for n, _, ms in p_ops[:8]],
                  "top_kernels": [[n, round(ms, 3)] for n, _, ms in p_kernels[:5]]}


def one_look(summary: dict, kind: str = "continuation") -> str:
    """One line: where the profiled prefill steps of `kind` spent their wall (top ops, the
    GPU's time of the kernels they launched)."""
    s = summary.get(kind) or {}
    if not s.get("steps"):
        return f"no {kind} prefill steps profiled"
    wall = s["wall_ms"] or 1.0
    ops = ", ".join(f"{n} {100 * ms / wall:.0f}%" for n, ms in s["top_ops"][:6])
    kern = ", ".join(f"{n[:60]} {ms:.1f} ms" for n, ms in s["top_kernels"][:3])
    return (f"{s['steps']} {kind} prefill steps, {wall:.1f} ms wall (engine thread): {ops}; "
            f"their kernels {s['kernel_ms']:.1f} ms of GPU" + (f" ({kern})" if kern else ""))
