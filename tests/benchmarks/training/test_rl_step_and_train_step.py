"""The training benchmarks run end to end on a CPU with tiny shapes and report every number
(performance is printed, never asserted: only presence and sign are checked here), plus the
formulas they report against."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def _run(module: str, *flags: str, timeout: int = 120) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *flags], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**__import__("os").environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line), proc.stdout


def _spread_ok(s: dict) -> bool:
    return 0 < s["min"] <= s["median"] <= s["max"]


@pytest.mark.launch
def test_bench_rl_step_tiny_on_cpu(tmp_path):
    out = tmp_path / "rl.json"
    result, stdout = _run("training.rl_step", "--shape", "tiny", "--prompts", "4", "--samples", "2",
                          "--response-len", "16", "--steps", "2", "--peak-tflops", "1",
                          "--peak-hbm-gbps", "100", "--workdir", str(tmp_path / "w"),
                          "--json", str(out),
                          "--no-fused-old-logprobs")  # the π_old recompute as a phase of its own
    assert json.loads(out.read_text()) == result
    assert result["gpu"] and len(result["steps"]) == 2 and result["learner_gpus"] == 1
    positive = ["rollout_s", "recompute_s", "update_s", "sync_s", "total_s", "rollout_tokens",
                "rollout_tokens_per_s", "recompute_tokens_per_s", "update_tokens_per_s",
                "recompute_mfu", "update_mfu", "rollout_hbm_roofline_fraction"]
    for step in result["steps"]:
        for key in positive:
            assert step[key] > 0, key
    for key in positive:
        assert _spread_ok(result["summary"][key]), key
    assert "rollout_hbm_roofline_fraction" in stdout and "update_mfu" in stdout


@pytest.mark.launch
def test_bench_train_tiny_on_cpu(tmp_path):
    result, stdout = _run("training.train_step", "--shape", "tiny", "--seq-len", "48", "--vary-lengths",
                          "--seqs-per-step", "6", "--max-tokens-per-gpu", "128", "--steps", "1",
                          "--warmup", "1", "--repeats", "2", "--peak-tflops", "1", "--grpo-step")
    assert result["micro_batches"] > 1 and result["repeats"] == 2
    for phase in ("forward", "train", "grpo_recompute", "grpo_fused"):
        for key in ("step_s", "tokens_per_s", "mfu"):
            assert _spread_ok(result[phase][key]), (phase, key)
    assert result["tokens_per_s"] > 0 and math.isfinite(result["loss"])
    assert "min / median / max" in stdout and "recompute then update" in stdout


def test_vary_lengths_are_seeded_and_in_range():
    bench = _load("training.train_step")
    args = bench.parse_args(["--seq-len", "800", "--vary-lengths", "--seqs-per-step", "200"])
    lengths = bench.sequence_lengths(args)
    assert lengths == bench.sequence_lengths(args) and len(set(lengths)) > 50
    assert min(lengths) >= 200 and max(lengths) <= 1400
    fixed = bench.parse_args(["--seq-len", "800", "--seqs-per-step", "3"])
    assert bench.sequence_lengths(fixed) == [800] * 3


def test_train_flops_reduce_to_the_fixed_length_formula():
    bench = _load("training.train_step")
    from checkpoint_tools.model_config import arch_from_hf_config

    arch = arch_from_hf_config(dict(bench.SMOLLM2_135M), source="test")
    assert bench.train_flops(arch, [800] * 4) == 4 * 800 * bench.flops_per_token(arch, 800)
    # matmul params of SmolLM2-135M (lm head tied, counted once): ~134.5M
    assert 6 * 134e6 < bench.flops_per_token(arch, 0) < 6 * 135e6


def test_decode_bytes_formula():
    rl = _load("training.rl_step")
    dense = rl.DecodeModel(weight_bytes=1000.0, kv_bytes_per_token=10.0, max_running=2,
                           kv_cap=math.inf)
    # steps = max(3, ceil(5 / 2)) = 3; KV tokens read: (4 + 5 + 6) + (1 + 2) = 18
    assert dense.bytes([4, 1], [3, 2]) == 3 * 1000 + 18 * 10
    capped = rl.DecodeModel(1000.0, 10.0, max_running=1, kv_cap=5)
    # steps = max(3, 5) = 5; KV tokens: min(4,5) + min(5,5) + min(6,5) + 1 + 2 = 17
    assert capped.bytes([4, 1], [3, 2]) == 5 * 1000 + 17 * 10


def _phase_metrics(recompute_s: float, update_s: float) -> dict:
    """The trainer's step metrics that ``step_numbers`` reads (rollout ready: no roofline)."""
    times = {f"time_{p}": 1.0 for p in ("rollout", "reward", "sync", "total")}
    return {**times, "time_rollout": 0.0, "time_recompute": recompute_s, "time_update": update_s,
            "rollout_tokens_per_s": 1.0, "response_len_mean": 3.0, "reward_mean": 0.0,
            "aborted": 0.0}


def test_rl_step_mfu_is_per_learner_gpu(monkeypatch):
    """The recorded sequences are the whole batch (every rank's share): its FLOPs are set against
    the peak of every learner GPU. Hand-computed: SmolLM2-135M, two sequences of 10 and 30
    tokens, 6 x matmul params per token plus attention, 2 s of update and 0.5 s of recompute on
    4 ranks of 1e12 FLOP/s each. (Mutation check: dividing by one GPU's peak, as before, gives
    4x these and fails.)"""
    import torch.distributed as dist

    from checkpoint_tools.model_config import arch_from_hf_config
    from trainer.learner.packing import Sample

    rl, bench = _load("training.rl_step"), _load("training.train_step")
    arch = arch_from_hf_config(dict(bench.SMOLLM2_135M), source="test")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    machine = rl.Machine.detect(rl.parse_args(["--peak-tflops", "1"])[0])
    assert machine.learner_gpus == 4 and machine.peak_flops == 1e12
    seqs = [Sample([1] * 7, [2] * 3), Sample([1] * 10, [2] * 20)]
    rec = rl.Recorder(recompute=seqs, update=seqs)
    out = rl.step_numbers(_phase_metrics(0.5, 2.0), rec, arch, None, machine)
    d, f, hd, L = 576, 1536, 64, 30
    params = L * (d * (9 + 2 * 3) * hd + 9 * hd * d + 3 * d * f) + 49152 * d
    flops = sum(n * (6 * params + 6 * L * n * 9 * hd) for n in (10, 30))
    assert out["update_mfu"] == pytest.approx(flops / 2.0 / 4e12, rel=1e-12)
    assert out["recompute_mfu"] == pytest.approx(flops / 3 / 0.5 / 4e12, rel=1e-12)
    assert "rollout_hbm_roofline_fraction" not in out


def _committed_rl_steps():
    """Every committed ``benchmarks.training.rl_step`` result (its summary holds an update MFU)."""
    for path in sorted((ROOT / "docs" / "data").rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "update_mfu" in data.get("summary", {}):
            yield path, data


def test_committed_rl_step_mfus_are_per_learner_gpu():
    """Each committed result names its learner GPUs (a layout run: its layout's trainer GPUs)
    and holds MFUs a GPU can reach (the whole-batch ones reached 1.2 on DP 4)."""
    layouts = _load("studies.layouts").LAYOUTS
    paths = []
    for path, data in _committed_rl_steps():
        named = [k for k in layouts if path.stem.endswith("-" + k)]
        if path.parent.name.startswith("layouts"):
            assert data["learner_gpus"] == layouts[max(named, key=len)].trainer_gpus, path
        assert data["learner_gpus"] >= 1, path
        steps = data.get("steps", [data["summary"]])
        values = [s[k] for s in steps for k in ("recompute_mfu", "update_mfu")]
        assert all(0 <= (v if isinstance(v, float) else v["max"]) < 0.6 for v in values), path
        paths.append(path)
    assert len(paths) >= 30


@pytest.mark.parametrize("shape", ["smollm2-135m", "qwen2.5-0.5b"])
def test_rl_step_shapes_match_bench_train(shape):
    """The random checkpoint common/checkpoint.py builds has the architecture training/train_step.py
    measures."""
    checkpoint, bench = _load("common.checkpoint"), _load("training.train_step")
    _, overrides = checkpoint.shape_spec(shape)
    for key, value in overrides.items():
        if key in bench.SHAPES[shape]:
            assert bench.SHAPES[shape][key] == value, key


def test_steady_state_leaves_out_the_first_timed_step():
    """``steady``: min / median / max over the timed steps after the first (hand-computed)."""
    from benchmarks.training.rl_step import steady_summary, summarize

    steps = [{"total_s": t} for t in (10.0, 5.0, 7.0, 9.0)]
    assert steady_summary(steps)["total_s"] == {"min": 5.0, "median": 7.0, "max": 9.0}
    assert summarize(steps)["total_s"] == {"min": 5.0, "median": 8.0, "max": 10.0}
    assert steady_summary(steps[:1])["total_s"] == {"min": 10.0, "median": 10.0, "max": 10.0}


@pytest.mark.parametrize("staleness,engine_process,offload,extra", [
    (1, True, None, 1),  # an engine process generates beside training: one rollout ahead
    (1, False, False, 1),  # an in-process engine that keeps its pool (--no-offload-rollout)
    (1, False, True, 0),  # one that releases it: memory_safe keeps the loop synchronous
    (0, True, None, 0),  # the bound at 0 generates nothing ahead
    (None, True, None, 0),  # synchronous
])
def test_a_run_generating_ahead_makes_one_more_rollout(staleness, engine_process, offload, extra):
    """rl_step's last timed step overlaps a generation only if the run makes one rollout more
    than it trains: exactly where the loop overlaps (``async_rollout.memory_safe``)."""
    import dataclasses

    from benchmarks.training.rl_step import generate_ahead
    from trainer.rollout.async_rollout import AsyncConfig, memory_safe
    from trainer.rollout.engines.config import EngineConfig
    from trainer.run_config import LoopConfig

    @dataclasses.dataclass
    class Rollout:
        engines: EngineConfig
        asynchrony: AsyncConfig

    @dataclasses.dataclass
    class Cfg:
        loop: LoopConfig
        rollout: Rollout

    engines = EngineConfig("m", {}, offload=offload, engine_process=engine_process)
    cfg = Cfg(LoopConfig(num_rollout=5), Rollout(engines, AsyncConfig(staleness)))
    assert generate_ahead(cfg).loop.num_rollout == 5 + extra
    assert bool(memory_safe(cfg.rollout.asynchrony, engines).max_staleness) == bool(extra)
