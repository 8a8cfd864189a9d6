"""Training metrics: a JSONL log (always), TensorBoard and wandb (on request), PNG plots and the
end-of-run summary table, one module each (``logger.py``, ``plots.py``, ``summary.py``; which key
is which: ``keys.py``); one rollout's metrics gathered by ``step.py``, the device's peak memory
by ``memory.py``.

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

from .logger import (METRICS_FILE, WANDB_MODES, MetricsLogger, TrackingConfig, add_logging_args,
                     default_log_dir, metrics_logger_from_args, open_metrics_logger, read_metrics,
                     tracking_config_from_args, truncate_metrics)
from .memory import peak_memory_metrics
from .plots import PlotPanels, dense_kv_slots, plot_metrics, plot_panels
from .step import StepMetrics
from .summary import format_speed, format_summary, print_summary

__all__ = ["METRICS_FILE", "WANDB_MODES", "MetricsLogger", "PlotPanels", "StepMetrics",
           "TrackingConfig", "add_logging_args", "default_log_dir", "dense_kv_slots",
           "format_speed", "format_summary", "metrics_logger_from_args", "open_metrics_logger",
           "peak_memory_metrics", "plot_metrics", "plot_panels", "print_summary", "read_metrics",
           "tracking_config_from_args", "truncate_metrics"]
