"""The end-of-run summary: a first-vs-last table, the speed per GPU and the time split."""

from __future__ import annotations

from pathlib import Path

from .keys import (TIME_PHASES, is_episode, is_eval, is_fraction, is_kv, is_mismatch,
                   is_response_length, is_reward, key_series, time_phase)
from .plots import plot_metrics


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    value += 0.0  # -0.0 (a mean of zeros with a negative sign, e.g. a zero loss) prints as 0
    if "bytes" in key:
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:.1f} {unit}"
        return f"{value:.0f} B"
    return f"{value:.4g}"


def _window_mean(rows: list[dict], key: str, window: int, last: bool) -> float | None:
    values = key_series(rows, key)[1]
    if not values:
        return None
    part = values[-window:] if last else values[:window]
    return sum(part) / len(part)


def format_summary(history: list[dict], window: int = 1) -> str:
    """A first-vs-last table of the run (reward, response length, turns and tool calls, KV,
    correction fractions, mismatch, eval) and the share of wall time per phase. Rows are per-rollout metric dicts with
    the rollout id under ``step`` or ``rollout``. ``window`` > 1 averages the first/last ``window`` rollouts
    that have each key."""
    if not history:
        return "no metrics logged"
    # the rollout id may be under "step" (read_metrics rows) or "rollout"; else the position
    rows = [{**r, "step": r.get("step", r.get("rollout", i))} for i, r in enumerate(history)]
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in ("step", "rollout") and k not in keys)
    groups = [
        [k for k in keys if is_reward(k)],
        [k for k in keys if is_response_length(k)],
        [k for k in keys if is_episode(k)],  # turns and tool calls, on a multi-turn run
        [k for k in keys if is_kv(k)],
        [k for k in keys if is_fraction(k)],
        [k for k in keys if is_mismatch(k) and not is_fraction(k)],
        [k for k in keys if is_eval(k)],
    ]
    shown = list(dict.fromkeys(k for group in groups for k in group))  # a key may match two groups
    steps = [r["step"] for r in rows]
    first_label = "first" if window == 1 else f"first {window}"
    last_label = "last" if window == 1 else f"last {window}"
    table = [("metric", first_label, last_label, "change")]
    for key in shown:
        a, b = _window_mean(rows, key, window, False), _window_mean(rows, key, window, True)
        if a is None or b is None:
            change = "-"
        elif "bytes" in key:
            change = ("+" if b >= a else "-") + _fmt(key, abs(b - a))
        else:
            change = f"{(b - a) + 0.0:+.4g}"
        table.append((key, _fmt(key, a), _fmt(key, b), change))
    widths = [max(len(r[c]) for r in table) for c in range(4)]
    lines = [f"rollouts {min(steps)}..{max(steps)} ({len(rows)} logged)"]
    for i, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    totals: dict[str, float] = {}
    for key in keys:
        phase = time_phase(key)
        if phase is not None:
            totals[phase] = totals.get(phase, 0.0) + sum(key_series(rows, key)[1])
    lines += format_speed(rows)
    total = sum(totals.values())
    if total > 0:
        order = [p for p in TIME_PHASES if p in totals] + sorted(p for p in totals if p not in TIME_PHASES)
        split = " | ".join(f"{p} {totals[p]:.1f} s ({100 * totals[p] / total:.0f}%)" for p in order)
        lines.append(f"time split (total {total:.1f} s): {split}")
    return "\n".join(lines)


# --- speed ------------------------------------------------------------------------------------

SPEED_PHASES = ("generate", "reference", "old_logp", "update")  # learner/speed.py's phases


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def format_speed(rows: list[dict]) -> list[str]:
    """The ``perf/`` metrics' table: per phase, the median tokens/s and MFU per GPU over the
    rollouts after the first (its compiles and warm-up), over all when there is one."""
    measured = rows[1:] if len(rows) > 1 else rows
    table = []
    for phase in SPEED_PHASES:
        rate = key_series(measured, f"perf/{phase}_tokens_per_s")[1]
        if rate:
            mfu = key_series(measured, f"perf/{phase}_mfu")[1]
            table.append((phase, f"{_median(rate):,.0f}", f"{_median(mfu):.1%}" if mfu else "-"))
    if not table:
        return []
    steps = [r["step"] for r in measured]
    head = (f"speed per GPU (median over rollouts {min(steps)}..{max(steps)}"
            + ("; the first left out as warm-up" if len(rows) > 1 else "") + "):")
    widths = [max(len(r[c]) for r in table + [("phase", "tokens/s", "MFU")]) for c in range(3)]
    fmt = lambda r: "  " + "  ".join(c.ljust(w) if j == 0 else c.rjust(w)  # noqa: E731
                                     for j, (c, w) in enumerate(zip(r, widths)))
    return [head, fmt(("phase", "tokens/s", "MFU"))] + [fmt(r) for r in table]


def print_summary(history: list[dict], log_dir: Path) -> None:
    """Plots of ``log_dir``'s metrics.jsonl and the first-vs-last table of ``history``."""
    plots = plot_metrics(log_dir / "metrics.jsonl", log_dir)
    print(format_summary(history, window=max(1, min(5, len(history) // 2))))
    print(f"metrics: {log_dir / 'metrics.jsonl'}; plots: {', '.join(p.name for p in plots)}")
