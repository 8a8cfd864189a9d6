"""Every run's own speed (learner/speed.py): the perf/ metrics of a reference forward, a π_old
forward and an update equal tokens / seconds and FLOPs / seconds / peak computed by hand from
the samples and the model's config, with the seconds injected; generation's too; the
end-of-run summary's speed table.

Mutation checks: counting the prompt out of the update's tokens, or the attention term out of
the FLOPs, or dividing by the wrong phase's seconds, fails ``test_phase_metrics_*``; leaving
the first rollout in the summary's median fails ``test_summary_speed_table``."""

from __future__ import annotations

import json

import pytest
import torch

from checkpoint_tools import cpu_megatron

SHAPES = ((5, 7), (3, 12), (9, 1), (4, 4))
PEAK = 1e12


def hand_flops(config: dict, n: int) -> float:
    """Forward + backward FLOPs of one length-n sequence, written out from the HF config."""
    d, f, L, V = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                       "vocab_size"))
    nh, ng = config["num_attention_heads"], config["num_key_value_heads"]
    hd = d // nh
    qkv, out, mlp = d * (nh + 2 * ng) * hd, nh * hd * d, 3 * d * f
    return n * (6 * (L * (qkv + out + mlp) + V * d) + 6 * L * n * nh * hd)


class Clock:
    """perf_counter stand-in: each timed block lasts the next of ``durations``."""

    def __init__(self, durations):
        self.durations, self.now, self.started = list(durations), 0.0, False

    def __call__(self) -> float:
        if self.started:
            self.now += self.durations.pop(0)
        self.started = not self.started
        return self.now


def speed_task(rank, world, port, hf_dir, cache):
    from trainer.learner.model_provider import ModelConfig
    from trainer.learner.packing import Sample
    from trainer.learner.policy_trainer import OptimConfig, PolicyTrainer, TrainConfig
    from trainer.learner.speed import SpeedMeter, rollout_speed

    cpu_megatron.init_distributed(rank, world, master_port=port)
    cpu_megatron.init_model_parallel(tp=1)
    model = ModelConfig(hf_checkpoint=hf_dir, dtype=torch.float32)
    policy = PolicyTrainer(model, OptimConfig(), TrainConfig(max_tokens_per_gpu=30),
                           cache_dir=cache)
    reference = PolicyTrainer(model, OptimConfig(), policy.train_cfg, cache_dir=cache,
                              trainable=False)
    policy.speed, reference.speed = SpeedMeter(Clock([2.0, 3.0])), SpeedMeter(Clock([0.5]))
    g = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(0, 100, (p,), generator=g).tolist(),
                      torch.randint(0, 100, (r,), generator=g).tolist()) for p, r in SHAPES]
    reference.compute_logprobs(samples)  # 0.5 s
    policy.compute_logprobs(samples)  # 2 s
    policy.train_step(samples, lambda lp, ent, ids: (sum(x.sum() for x in lp), {}))  # 3 s
    metrics = rollout_speed((policy, reference), peak=PEAK)
    return metrics, rollout_speed((policy, reference), peak=PEAK)  # drained: nothing twice


def test_phase_metrics_equal_hand_computed(tiny_model_factory, tmp_path):
    hf = tiny_model_factory("qwen2-untied")
    config = json.loads((hf / "config.json").read_text())
    (metrics, again), = cpu_megatron.run_on_ranks((__file__, "speed_task"), 1, str(hf),
                                                  str(tmp_path / "c"))
    lengths = [p + r for p, r in SHAPES]
    tokens, train = sum(lengths), sum(hand_flops(config, n) for n in lengths)
    want = {"perf/reference_tokens_per_s": tokens / 0.5, "perf/reference_mfu": train / 3 / 0.5 / PEAK,
            "perf/old_logp_tokens_per_s": tokens / 2.0, "perf/old_logp_mfu": train / 3 / 2.0 / PEAK,
            "perf/update_tokens_per_s": tokens / 3.0, "perf/update_mfu": train / 3.0 / PEAK}
    assert metrics.keys() == want.keys()
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12), key
    assert again == {}


def test_generation_metrics_per_gpu():
    from trainer.learner.packing import Sample
    from trainer.learner.speed import generation_timing, rollout_speed

    config = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512)

    class Arch:  # Megatron's names for the same numbers
        hidden_size, ffn_hidden_size, num_layers, vocab_size = 64, 128, 2, 512
        num_attention_heads, num_query_groups, head_dim = 4, 2, 16

    samples = [Sample([1] * 10, [2] * 30), Sample([1] * 10, [2] * 50)]
    gen = generation_timing(Arch, samples, seconds=4.0, gpus=2)
    metrics = rollout_speed((), gen, peak=PEAK)
    assert metrics["perf/generate_tokens_per_s"] == pytest.approx(80 / 2 / 4.0)
    forward = (hand_flops(config, 40) + hand_flops(config, 60)) / 3
    assert metrics["perf/generate_mfu"] == pytest.approx(forward / 2 / 4.0 / PEAK)


def test_unknown_device_leaves_mfu_out(capsys):
    from trainer.learner.speed import PhaseTiming, peak_for

    assert peak_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_for("NVIDIA H100 PCIe") == 756e12
    assert peak_for("cpu") is None and peak_for("NVIDIA GeForce RTX 4090") is None
    assert PhaseTiming(100, 1e9, 2.0).metrics("update", None) == {"perf/update_tokens_per_s": 50.0}


def test_summary_speed_table():
    from trainer.tracking import format_summary

    rows = [{"step": 1, "perf/update_tokens_per_s": 10.0, "perf/update_mfu": 0.01},  # warm-up
            {"step": 2, "perf/update_tokens_per_s": 30000.0, "perf/update_mfu": 0.10},
            {"step": 3, "perf/update_tokens_per_s": 32000.0, "perf/update_mfu": 0.12,
             "perf/generate_tokens_per_s": 5000.0},
            {"step": 4, "perf/update_tokens_per_s": 34000.0, "perf/update_mfu": 0.14}]
    text = format_summary(rows)
    assert "speed per GPU (median over rollouts 2..4; the first left out as warm-up):" in text
    update = next(line for line in text.splitlines() if line.strip().startswith("update"))
    assert update.split() == ["update", "32,000", "12.0%"]
    generate = next(line for line in text.splitlines() if line.strip().startswith("generate"))
    assert generate.split() == ["generate", "5,000", "-"]
