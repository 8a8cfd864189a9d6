"""Training metrics: a JSONL log (always), TensorBoard and wandb (on request), PNG plots and the
end-of-run summary table.

    logger = MetricsLogger("runs/x", use_tensorboard=args.use_tensorboard)
    logger.log(rollout_id, {"reward_mean": 0.4, "time/rollout": 12.5})
    logger.close()
    plot_metrics("runs/x/metrics.jsonl")          # -> [runs/x/reward.png, ...]
    print(format_summary(read_metrics("runs/x/metrics.jsonl")))

Key names the plots and the summary look for (a ``prefix/`` such as ``rollout/`` or ``train/``
is ignored when matching, so ``rollout/reward_mean`` counts as ``reward_mean``):

* reward: ``reward_mean``, ``raw_reward_mean``, ``accuracy``;
* response length: ``response_length_mean``, ``response_length_max`` (and other
  ``response_length*`` / ``response_len*``);
* rollout-train mismatch: ``train_rollout_logprob_abs_diff``, ``kl_sparse_old``, ``kl``,
  ``k3_kl``, ``log_ppl_abs_diff`` (the correction module's ``mismatch_metrics``);
* correction fractions: every key containing ``fraction``;
* KV memory: every key whose name starts with ``kv_`` (``*_bytes`` shown in MiB/GiB);
* evaluation: every key starting with ``eval/`` (kept out of the training groups above);
* time split: ``time/<phase>``, ``time_<phase>`` or ``<phase>_time`` in seconds, phases
  ``rollout``, ``recompute``, ``update``, ``sync`` first, others after;
* speed: ``perf/<phase>_tokens_per_s`` and ``perf/<phase>_mfu`` per GPU (``learner/speed.py``).

Only rank 0 should create a :class:`MetricsLogger`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import time
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
WANDB_MODES = ("offline", "online", "disabled")

REWARD_KEYS = ("reward_mean", "raw_reward_mean", "accuracy")
RESPONSE_LENGTH_PREFIXES = ("response_length", "response_len")
MISMATCH_KEYS = ("train_rollout_logprob_abs_diff", "kl_sparse_old", "kl", "k3_kl", "log_ppl_abs_diff")
TIME_PHASES = ("rollout", "recompute", "update", "sync")


def _base(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _is_eval(key: str) -> bool:
    return key.startswith("eval/")


def _is_reward(key: str) -> bool:
    return _base(key) in REWARD_KEYS and not _is_eval(key)


def _is_response_length(key: str) -> bool:
    return _base(key).startswith(RESPONSE_LENGTH_PREFIXES) and not _is_eval(key)


def _is_mismatch(key: str) -> bool:
    return _base(key) in MISMATCH_KEYS


def _is_fraction(key: str) -> bool:
    return "fraction" in key


def _is_kv(key: str) -> bool:
    return _base(key).startswith("kv_")


# whole-step timers: summing them with the phases would count the same seconds twice
_NOT_PHASES = ("total", "step", "wall", "elapsed", "iteration")


def _time_phase(key: str) -> str | None:
    """The phase a timing key measures (``time/rollout``, ``time_rollout``, ``rollout_time``)."""
    base = _base(key)
    if key.startswith("time/"):
        phase = key[len("time/"):]
    elif base.startswith("time_"):
        phase = base[len("time_"):]
    elif base.endswith("_time"):
        phase = base[:-len("_time")]
    else:
        return None
    return phase if phase and phase not in _NOT_PHASES else None


# --------------------------------------------------------------------------- device memory

def _read_peaks(torch) -> list[float]:
    """This process's device peaks since the last call, then reset: each rollout its own peak."""
    gib = float(1 << 30)
    peaks = [torch.cuda.max_memory_allocated() / gib, torch.cuda.max_memory_reserved() / gib]
    torch.cuda.reset_peak_memory_stats()
    return peaks


def _max_over_ranks(torch, peaks: list[float]) -> list[float]:
    """Two floats in one all-reduce: the fullest GPU of the job (any rank may be the one OOMing)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return peaks
    t = torch.tensor(peaks, dtype=torch.float64, device=torch.cuda.current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def peak_memory_metrics() -> dict:
    """Collective on CUDA (every rank calls it once per rollout): this rank's peaks (rank 0's in
    the log) and the max over ranks, in GiB; {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    mine = _read_peaks(torch)
    top = _max_over_ranks(torch, mine)
    return {"memory/peak_allocated_gib": mine[0], "memory/peak_reserved_gib": mine[1],
            "memory/peak_allocated_gib_max": top[0], "memory/peak_reserved_gib_max": top[1]}


# --------------------------------------------------------------------------- logging

def _json_value(key: str, value):
    """A JSON-safe number; non-finite floats become null (strict JSON has no NaN)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        return value
    try:
        out = float(value)  # python/numpy floats, one-element tensors
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r} has value {value!r} of type {type(value).__name__}; "
                        f"expected a number") from None
    return out if math.isfinite(out) else None


class MetricsLogger:
    """Appends ``{"step": step, **metrics}`` to ``log_dir/metrics.jsonl`` (flushed every call) and
    mirrors numbers to TensorBoard (``log_dir/tensorboard``) and wandb when asked."""

    def __init__(self, log_dir, *, use_tensorboard: bool = False, use_wandb: bool = False,
                 wandb_project: str | None = None, wandb_mode: str = "offline",
                 run_name: str | None = None, config: dict | None = None,
                 keep_through: int | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.log_dir / METRICS_FILE
        if keep_through is not None:
            truncate_metrics(self.path, keep_through)
        self._tb = None
        self._wandb = None
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError(f"--use-tensorboard needs the tensorboard package "
                                  f"(pip install tensorboard): {exc}") from exc
            # a resumed run's events after its step replace the interrupted run's (as the rows)
            purge = None if keep_through is None else keep_through + 1
            self._tb = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"), purge_step=purge)
        if use_wandb:
            if wandb_mode not in WANDB_MODES:
                raise ValueError(f"--wandb-mode {wandb_mode!r}: choose one of {', '.join(WANDB_MODES)}")
            try:
                import wandb
            except ImportError as exc:
                raise ImportError(f"--use-wandb needs the wandb package (pip install wandb): {exc}") from exc
            self._wandb = wandb.init(project=wandb_project or "sparse-rl", name=run_name, mode=wandb_mode,
                                     config=config, dir=str(self.log_dir))
        if config is not None:
            # the run's settings next to its metrics, so a plot can always be traced to its flags
            (self.log_dir / "config.json").write_text(json.dumps(config, indent=1, default=str, sort_keys=True))
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {step!r}")
        if "step" in metrics:
            raise ValueError("metrics must not contain the key 'step' (it is the first argument)")
        row = {"step": int(step)}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"metric names must be strings, got {key!r}")
            row[key] = _json_value(key, value)
        if self._file is None:
            raise RuntimeError(f"MetricsLogger({self.log_dir}) is closed")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        numeric = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=int(step))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(jsonl_path) -> list[dict]:
    """The logged rows merged per step, sorted by step.

    Rows of one step merge (later values win): eval metrics logged separately from the rollout's,
    and steps re-logged after a resume, both end up as one row. A broken final line (a run killed
    mid-write) is ignored; a broken line elsewhere is an error naming the file and line.
    """
    path = Path(jsonl_path)
    if not path.is_file():
        raise FileNotFoundError(f"metrics file {path} not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    by_step: dict[int, dict] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if lineno == len(lines):
                break
            raise ValueError(f"{path}:{lineno}: not a metrics row ({exc})") from None
        by_step.setdefault(step, {"step": step}).update(row)
    return [by_step[s] for s in sorted(by_step)]


# --------------------------------------------------------------------------- plots

_PLOTS = (
    # file name, title, key filter, one axes per key (for keys of different scales)
    ("reward.png", "Reward", _is_reward, False),
    ("response_length.png", "Response length (tokens)", _is_response_length, False),
    ("rollout_train_kl.png", "Rollout (sparse) vs train (dense) mismatch", _is_mismatch, True),
    ("correction_fractions.png", "Correction fractions", _is_fraction, False),
    ("kv_memory.png", "KV memory per rollout", _is_kv, True),
    ("eval.png", "Evaluation", _is_eval, True),
)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(row["step"])
            ys.append(float(v))
    return xs, ys


def dense_kv_slots(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Per rollout, the KV slots a sample would hold at its end without compression: its mean
    prompt plus response tokens (the reference line of ``kv_peak_slots_per_sample``)."""
    xs, prompts = _series(rows, "prompt_len_mean")
    responses = dict(zip(*_series(rows, "response_len_mean")))
    return ([x for x in xs if x in responses],
            [p + responses[x] for x, p in zip(xs, prompts) if x in responses])


@dataclasses.dataclass
class PlotPanels:
    """What one figure shows of its series (key -> (steps, values)):

    - `drawn`: the series that get a line (a panel of their own in one-axes-per-key figures);
    - `constant`: in those figures, series that never change (key -> value): named in the title
      instead of a flat panel, unless every series is constant (then they are drawn);
    - `same_as`: a series equal to an earlier one (key -> that key; `accuracy` is `reward_mean`
      under 0/1 rewards): not drawn again under it, the earlier line's label names both
      (`reward_mean = accuracy`). Lines that differ get different line styles and markers."""
    drawn: dict[str, tuple[list, list]]
    constant: dict[str, float]
    same_as: dict[str, str]


def plot_panels(series: dict[str, tuple[list, list]], separate: bool) -> PlotPanels:
    constant = {k: ys[0] for k, (_, ys) in series.items()
                if separate and len(ys) > 1 and min(ys) == max(ys)}
    if len(constant) == len(series):
        constant = {}
    kept = {k: s for k, s in series.items() if k not in constant}
    same_as: dict[str, str] = {}
    for i, (key, s) in enumerate(kept.items()):
        earlier = [k for k in list(kept)[:i] if kept[k] == s and k not in same_as]
        if earlier and not separate:
            same_as[key] = earlier[0]
    drawn = {k: s for k, s in kept.items() if k not in same_as}
    return PlotPanels(drawn, constant, same_as)


_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "x"))  # line, marker: told apart in grey too


def _line_label(key: str, panels: PlotPanels) -> str:
    names = " = ".join([key, *(k for k, first in panels.same_as.items() if first == key)])
    return f"{names} (GiB)" if "bytes" in key else names


def _constant_note(panels: PlotPanels) -> str:
    import textwrap

    if not panels.constant:
        return ""
    items = ", ".join(f"{k} = {v / 2**30:.3g} GiB" if "bytes" in k else f"{k} = {v:.6g}"
                      for k, v in panels.constant.items())
    return "\n" + textwrap.fill(f"constant, not drawn: {items}", 90)


def _legend_outside(ax, fontsize: int = 8) -> None:
    """Beside the axes, not over the lines (savefig's tight box keeps it in the image)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _draw_figure(plt, rows: list[dict], title: str, panels: PlotPanels, separate: bool):
    n_axes = len(panels.drawn) if separate else 1
    fig, axes = plt.subplots(n_axes, 1, figsize=(7, 2.2 + 1.6 * n_axes), sharex=True, squeeze=False)
    for i, (key, (xs, ys)) in enumerate(panels.drawn.items()):
        ax = axes[i if separate else 0][0]
        if "bytes" in key:  # KV sizes read better in GiB than as 1e10
            ys = [y / 2**30 for y in ys]
        line, marker = _STYLES[i % len(_STYLES)]
        ax.plot(xs, ys, linestyle=line, marker=marker if len(xs) < 30 else None, markersize=3,
                label=_line_label(key, panels))
        if key == "kv_peak_slots_per_sample":  # what the same samples would hold dense
            ax.plot(*dense_kv_slots(rows), linestyle="--", color="gray",
                    label="dense: prompt + response tokens")
            _legend_outside(ax, 7)
        if separate:
            ax.set_ylabel(_line_label(key, panels), fontsize=8)
    for (ax,) in axes:
        ax.grid(alpha=0.3)
        if not separate:
            _legend_outside(ax)
    axes[0][0].set_title(title + _constant_note(panels), fontsize=10)
    axes[-1][0].set_xlabel("rollout")
    return fig


def plot_metrics(jsonl_path, out_dir=None) -> list[Path]:
    """Write PNGs of the logged metrics (``out_dir`` defaults to the JSONL's folder); plots
    whose keys never appear are skipped. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    rows = read_metrics(jsonl_path)
    out = Path(out_dir) if out_dir is not None else Path(jsonl_path).parent
    out.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k != "step" and k not in keys)
    written = []
    for file_name, title, wanted, separate in _PLOTS:
        series = {k: _series(rows, k) for k in keys if wanted(k)}
        series = {k: s for k, s in series.items() if s[0]}
        if not series:
            continue
        fig = _draw_figure(plt, rows, title, plot_panels(series, separate), separate)
        path = out / file_name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


# --------------------------------------------------------------------------- summary

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
    values = _series(rows, key)[1]
    if not values:
        return None
    part = values[-window:] if last else values[:window]
    return sum(part) / len(part)


def format_summary(history: list[dict], window: int = 1) -> str:
    """A first-vs-last table of the run (reward, response length, KV, correction fractions,
    mismatch, eval) and the share of wall time per phase. Rows are per-rollout metric dicts with
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
        [k for k in keys if _is_reward(k)],
        [k for k in keys if _is_response_length(k)],
        [k for k in keys if _is_kv(k)],
        [k for k in keys if _is_fraction(k)],
        [k for k in keys if _is_mismatch(k) and not _is_fraction(k)],
        [k for k in keys if _is_eval(k)],
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
        phase = _time_phase(key)
        if phase is not None:
            totals[phase] = totals.get(phase, 0.0) + sum(_series(rows, key)[1])
    lines += format_speed(rows)
    total = sum(totals.values())
    if total > 0:
        order = [p for p in TIME_PHASES if p in totals] + sorted(p for p in totals if p not in TIME_PHASES)
        split = " | ".join(f"{p} {totals[p]:.1f} s ({100 * totals[p] / total:.0f}%)" for p in order)
        lines.append(f"time split (total {total:.1f} s): {split}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- speed

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
        rate = _series(measured, f"perf/{phase}_tokens_per_s")[1]
        if rate:
            mfu = _series(measured, f"perf/{phase}_mfu")[1]
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


# --------------------------------------------------------------------------- flags

def print_summary(history: list[dict], log_dir: Path) -> None:
    """Plots of ``log_dir``'s metrics.jsonl and the first-vs-last table of ``history``."""
    plots = plot_metrics(log_dir / "metrics.jsonl", log_dir)
    print(format_summary(history, window=max(1, min(5, len(history) // 2))))
    print(f"metrics: {log_dir / 'metrics.jsonl'}; plots: {', '.join(p.name for p in plots)}")


def add_logging_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``--log-dir``, ``--use-tensorboard``, ``--use-wandb``, ``--wandb-project``, ``--wandb-mode``."""
    g = parser.add_argument_group("tracking: logging")
    g.add_argument("--log-dir", default=None,
                   help="folder for metrics.jsonl, plots, config.json and TensorBoard files "
                        "(default: runs/<date-time>)")
    g.add_argument("--use-tensorboard", action="store_true",
                   help="also log to TensorBoard under <log-dir>/tensorboard (needs the tensorboard package)")
    g.add_argument("--use-wandb", action="store_true", help="also log to wandb (needs the wandb package)")
    g.add_argument("--wandb-project", default=None, help="wandb project (default: sparse-rl)")
    g.add_argument("--wandb-mode", choices=WANDB_MODES, default="offline",
                   help="wandb mode; offline writes under <log-dir>/wandb and uploads nothing "
                        "until `wandb sync` (default: offline)")
    return parser


def default_log_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


@dataclasses.dataclass
class TrackingConfig:
    """Where the metrics go (the flags of :func:`add_logging_args`)."""

    log_dir: Path
    use_tensorboard: bool = False
    use_wandb: bool = False
    wandb_project: str | None = None
    wandb_mode: str = "offline"


def tracking_config_from_args(args: argparse.Namespace, default_dir: Path | None = None
                              ) -> TrackingConfig:
    """``--log-dir``, else ``default_dir``, else :func:`default_log_dir`."""
    log_dir = Path(args.log_dir) if args.log_dir else (
        Path(default_dir) if default_dir is not None else default_log_dir())
    return TrackingConfig(log_dir, use_tensorboard=args.use_tensorboard, use_wandb=args.use_wandb,
                          wandb_project=args.wandb_project, wandb_mode=args.wandb_mode)


def open_metrics_logger(cfg: TrackingConfig, config: dict | None = None,
                        run_name: str | None = None,
                        keep_through: int | None = None) -> MetricsLogger:
    """A :class:`MetricsLogger` as ``cfg`` says (rank 0 only); ``keep_through``: see
    :func:`truncate_metrics`."""
    return MetricsLogger(cfg.log_dir, use_tensorboard=cfg.use_tensorboard,
                         use_wandb=cfg.use_wandb, wandb_project=cfg.wandb_project,
                         wandb_mode=cfg.wandb_mode, run_name=run_name, config=config,
                         keep_through=keep_through)


def truncate_metrics(path: Path, keep_through: int) -> None:
    """Drop the rows of ``metrics.jsonl`` after step ``keep_through``: a run resumed from the
    checkpoint of that step logs the later steps again, and each step must appear once. A fresh
    run (``keep_through`` 0) keeps none. A torn last line (the writer was killed) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue
        if keep_through > 0 and step <= keep_through:
            kept.append(line + "\n")
    path.write_text("".join(kept), encoding="utf-8")


def metrics_logger_from_args(args: argparse.Namespace, config: dict | None = None,
                             run_name: str | None = None) -> MetricsLogger:
    """A :class:`MetricsLogger` for flags registered by :func:`add_logging_args` (rank 0 only),
    named after its folder unless ``run_name`` is given."""
    cfg = tracking_config_from_args(args)
    return open_metrics_logger(cfg, config, run_name or cfg.log_dir.name)
