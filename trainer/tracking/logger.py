"""The metrics log: ``metrics.jsonl`` (always), TensorBoard and wandb (on request), read back
per step; the flags that say where it goes."""

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
    g.add_argument("--wandb-mode", choices=WANDB_MODES, default=TrackingConfig.wandb_mode,
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
