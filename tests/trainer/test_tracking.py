"""trainer.tracking: the JSONL log, optional TensorBoard/wandb, plots and the summary table."""

from __future__ import annotations

import argparse
import importlib.util
import json

import numpy as np
import pytest
import torch

from trainer.tracking import (MetricsLogger, add_logging_args, format_summary, metrics_logger_from_args,
                              plot_metrics, read_metrics)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_rows_flushed_and_typed(tmp_path):
    logger = MetricsLogger(tmp_path / "run", config={"lr": 1e-6, "path": tmp_path})
    logger.log(0, {"reward_mean": 0.25, "n": 3, "ok": True, "np": np.float32(0.5),
                   "t": torch.tensor(2.0), "bad": float("nan"), "inf": float("inf")})
    path = tmp_path / "run" / "metrics.jsonl"
    # readable before close: every call is flushed, so a crashed run keeps its metrics
    assert _lines(path) == [{"step": 0, "reward_mean": 0.25, "n": 3, "ok": 1, "np": 0.5, "t": 2.0,
                             "bad": None, "inf": None}]
    logger.log(1, {"reward_mean": 0.5})
    logger.close()
    assert [r["step"] for r in _lines(path)] == [0, 1]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["lr"] == 1e-6
    # a second logger (a resumed run) appends
    with MetricsLogger(tmp_path / "run") as again:
        again.log(2, {"reward_mean": 0.75})
    assert [r["reward_mean"] for r in _lines(path)] == [0.25, 0.5, 0.75]


def test_log_errors(tmp_path):
    logger = MetricsLogger(tmp_path)
    with pytest.raises(ValueError, match="'step'"):
        logger.log(0, {"step": 1})
    with pytest.raises(TypeError, match="metric 'x'"):
        logger.log(0, {"x": [1, 2]})
    with pytest.raises(TypeError, match="step must be an int"):
        logger.log(1.5, {"x": 1.0})
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(0, {"x": 1.0})


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_missing_names_the_flag(tmp_path):
    with pytest.raises(ImportError, match="--use-tensorboard.*pip install tensorboard"):
        MetricsLogger(tmp_path, use_tensorboard=True)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_writes_events(tmp_path):
    with MetricsLogger(tmp_path, use_tensorboard=True) as logger:
        logger.log(0, {"reward_mean": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_missing_names_the_flag(tmp_path):
    with pytest.raises(ImportError, match="--use-wandb.*pip install wandb"):
        MetricsLogger(tmp_path, use_wandb=True)
    with pytest.raises(ValueError, match="--wandb-mode 'cloud'"):
        MetricsLogger(tmp_path, use_wandb=True, wandb_mode="cloud")


def test_read_metrics_merges_steps_and_names_bad_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 0, "a": 0}\n{"step": 1, "eval/acc": 0.5}\n'
                    '{"step": 1, "a": 2}\n{"step": 2, "a"')  # last line cut by a crash
    assert read_metrics(path) == [{"step": 0, "a": 0}, {"step": 1, "a": 2, "eval/acc": 0.5}]
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics row"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        read_metrics(tmp_path / "absent.jsonl")


def _history(n=4):
    rows = []
    for i in range(n):
        rows.append({
            "rollout/reward_mean": 0.25 * i, "accuracy": 0.2 * i,
            "response_length_mean": 1000 + 100 * i,
            "train_rollout_logprob_abs_diff": 0.01 * (i + 1), "kl": 0.001 * (i + 1),
            "truncated_fraction": 0.1, "rs_rejected_fraction": 0.05 * i,
            "kv_peak_bytes": 2**30 * (1 + i), "kv_tokens_saved": 500.0 * i,
            "time/rollout": 30.0, "time/recompute": 5.0, "time/update": 10.0, "time/sync": 5.0,
            "time/total": 50.0,
        })
    return rows


def test_plots_written_and_absent_groups_skipped(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step, row in enumerate(_history()):
            logger.log(step, row)
    paths = plot_metrics(tmp_path / "metrics.jsonl")
    assert [p.name for p in paths] == ["reward.png", "response_length.png", "rollout_train_kl.png",
                                       "correction_fractions.png", "kv_memory.png"]
    for p in paths:
        assert p.parent == tmp_path and p.read_bytes()[:8] == PNG_MAGIC

    only_reward = tmp_path / "r" / "metrics.jsonl"
    only_reward.parent.mkdir()
    only_reward.write_text('{"step": 0, "reward_mean": 0.1}\n{"step": 1, "reward_mean": 0.3, "x": null}\n'
                           '{"step": 2, "eval/math500/score": 0.5, "eval/math500/response_len": 900}\n')
    out = tmp_path / "plots"
    assert plot_metrics(only_reward, out) == [out / "reward.png", out / "eval.png"]


def test_summary_hand_computed():
    text = format_summary(_history())
    lines = text.splitlines()
    assert lines[0] == "rollouts 0..3 (4 logged)"
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[3:] if not ln.startswith("time split")}
    assert row["rollout/reward_mean"] == ["0", "0.75", "+0.75"]
    assert row["accuracy"] == ["0", "0.6", "+0.6"]
    assert row["response_length_mean"] == ["1000", "1300", "+300"]
    assert row["kv_peak_bytes"] == ["1.0", "GiB", "4.0", "GiB", "+3.0", "GiB"]
    assert row["rs_rejected_fraction"] == ["0", "0.15", "+0.15"]
    assert row["truncated_fraction"] == ["0.1", "0.1", "+0"]
    assert row["train_rollout_logprob_abs_diff"] == ["0.01", "0.04", "+0.03"]
    # 4 rollouts x (30 + 5 + 10 + 5) s; time/total is not a phase
    assert lines[-1] == ("time split (total 200.0 s): rollout 120.0 s (60%) | recompute 20.0 s (10%) | "
                         "update 40.0 s (20%) | sync 20.0 s (10%)")
    # window: mean of the first / last two rollouts
    windowed = format_summary(_history(), window=2)
    reward_line = next(ln for ln in windowed.splitlines() if ln.startswith("rollout/reward_mean"))
    assert reward_line.split()[1:] == ["0.125", "0.625", "+0.5"]
    assert format_summary([]) == "no metrics logged"


def test_summary_keys_missing_in_some_rows():
    # the trainer's history rows carry the rollout id as "rollout"
    history = [{"rollout": 5, "reward_mean": 0.5}, {"rollout": 6, "eval/aime24/score": 0.3},
               {"rollout": 7, "reward_mean": 0.7, "kv_used_tokens": 10.0, "eval/aime24/score": 0.4}]
    text = format_summary(history)
    assert text.splitlines()[0] == "rollouts 5..7 (3 logged)"
    row = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[3:]}
    assert set(row) == {"reward_mean", "kv_used_tokens", "eval/aime24/score"}
    assert row["reward_mean"] == ["0.5", "0.7", "+0.2"]
    assert row["eval/aime24/score"] == ["0.3", "0.4", "+0.1"]
    assert row["kv_used_tokens"] == ["10", "10", "+0"]
    assert "time split" not in text


def test_logging_flags(tmp_path):
    parser = add_logging_args(argparse.ArgumentParser())
    args = parser.parse_args([])
    assert (args.log_dir, args.use_tensorboard, args.use_wandb, args.wandb_project, args.wandb_mode) == \
        (None, False, False, None, "offline")
    args = parser.parse_args(["--log-dir", str(tmp_path / "l"), "--wandb-mode", "online", "--wandb-project", "p"])
    assert args.wandb_mode == "online" and args.wandb_project == "p"
    with pytest.raises(SystemExit):
        parser.parse_args(["--wandb-mode", "cloud"])
    with metrics_logger_from_args(args, config={"a": 1}) as logger:
        logger.log(3, {"x": 1.0})
    assert _lines(tmp_path / "l" / "metrics.jsonl") == [{"step": 3, "x": 1.0}]


def test_summary_shows_a_multi_turn_runs_turns_and_tool_calls():
    """The arith-tool run's table (issue 70): turns and tool calls per sample, first vs last,
    in the order the episode's stats are read (after the response length)."""
    history = [{"step": 0, "reward_mean": 0.1, "response_length_mean": 80.0,
                "rollout/turns_per_sample": 1.5, "rollout/tool_calls_per_sample": 0.5,
                "rollout/tool_errors_per_sample": 0.25, "rollout/observation_tokens_per_sample": 9.0},
               {"step": 1, "reward_mean": 0.3, "response_length_mean": 90.0,
                "rollout/turns_per_sample": 2.0, "rollout/tool_calls_per_sample": 1.0,
                "rollout/tool_errors_per_sample": 0.0, "rollout/observation_tokens_per_sample": 12.0}]
    lines = format_summary(history).splitlines()
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[3:]}
    assert row["rollout/turns_per_sample"] == ["1.5", "2", "+0.5"]
    assert row["rollout/tool_calls_per_sample"] == ["0.5", "1", "+0.5"]
    assert row["rollout/tool_errors_per_sample"] == ["0.25", "0", "-0.25"]
    order = [ln.split()[0] for ln in lines[3:]]
    assert order.index("response_length_mean") < order.index("rollout/turns_per_sample")
    assert "rollout/observation_tokens_per_sample" not in row


def test_summary_prints_no_negative_zero():
    from trainer.tracking import format_summary

    text = format_summary([{"step": 0, "reward_mean": -0.0, "train/loss": 0.0},
                           {"step": 1, "reward_mean": 0.0, "train/loss": -0.0}])
    assert "reward_mean" in text and "-0" not in text, text


def test_kv_plot_has_the_dense_reference_line(tmp_path, monkeypatch):
    """kv_memory.png draws, beside the compressed peak per sample, what the same samples would
    hold dense: prompt + response tokens per rollout (hand-computed here)."""
    import matplotlib.axes

    rows = [{"step": 1, "kv_peak_slots_per_sample": 40.0, "prompt_len_mean": 30.0,
             "response_len_mean": 100.0},
            {"step": 2, "kv_peak_slots_per_sample": 44.0, "prompt_len_mean": 31.0,
             "response_len_mean": 150.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn, plot = [], matplotlib.axes.Axes.plot

    def record(ax, *args, **kw):
        drawn.append((kw.get("label"), [list(a) for a in args]))
        return plot(ax, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record)
    plot_metrics(path, tmp_path)
    dense = [d for label, d in drawn if label == "dense: prompt + response tokens"]
    assert dense == [[[1, 2], [130.0, 181.5]]]
