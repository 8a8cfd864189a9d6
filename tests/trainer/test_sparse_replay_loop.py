"""Training runs with eviction replay (CPU, fp32, R-KV rollouts): --sparse-recompute makes the
trainer's π_old the sampler's own policy (mismatch at the numerics floor, where the dense
recompute is far off); --train-sparse-policy trains that policy on-policy (first step's PPO KL
0); the records also travel over HTTP from a separate server."""

from __future__ import annotations

import subprocess
import sys


from checkpoint_tools import cpu_megatron

from .test_train_loop import ROOT, _flags, _metrics, _run, setup  # noqa: F401 (fixture)

RKV = ["--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "4",
       "--sglang-compress-divide-length", "2", "--sglang-compress-max-window", "2"]


def _one_step(hf, data, out, *extra):
    flags = _flags(hf, data, out, *extra, rollouts=1)
    flags[flags.index("--global-batch-size") + 1] = "16"  # the whole rollout: one step
    rc, log = _run(flags)
    assert rc == 0, log[-3000:]
    return _metrics(out)[0]


def test_sparse_recompute_brings_the_mismatch_to_the_floor(setup, tmp_path):  # noqa: F811
    hf, data, _ = setup
    dense = _one_step(hf, data, tmp_path / "dense", *RKV)
    sparse = _one_step(hf, data, tmp_path / "sparse", *RKV, "--sparse-recompute")
    assert sparse["kv_compressions_per_sample"] > 0
    assert sparse["train_rollout_logprob_abs_diff"] < 1e-5, sparse["train_rollout_logprob_abs_diff"]
    assert abs(sparse["k3_kl"]) < 1e-9, sparse["k3_kl"]
    # the same rollout recomputed densely is far from the sampler: the check can fail
    assert dense["train_rollout_logprob_abs_diff"] > 1e-3
    assert dense["k3_kl"] > 1e-4


def test_train_sparse_policy_is_on_policy(setup, tmp_path):  # noqa: F811
    """The update's forward replays the evictions: at the first step π_θ = π_old exactly."""
    hf, data, _ = setup
    row = _one_step(hf, data, tmp_path, *RKV, "--train-sparse-policy")
    assert abs(row["train/ppo_kl"]) < 1e-6, row["train/ppo_kl"]
    assert row["train/clipfrac"] == 0.0
    assert row["train_rollout_logprob_abs_diff"] < 1e-5


def test_records_travel_over_http(setup, tmp_path, wait_healthy):  # noqa: F811
    hf, data, _ = setup
    port = cpu_megatron.free_port()
    engine_flags = [f.replace("--sglang-", "--") for f in RKV]
    server = subprocess.Popen([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                               str(hf), "--port", str(port), "--max-total-tokens", "4096",
                               *engine_flags], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        row = _one_step(hf, data, tmp_path, "--rollout-server-urls", url, "--sparse-recompute")
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert row["kv_compressions_per_sample"] > 0
    assert row["train_rollout_logprob_abs_diff"] < 1e-5, row["train_rollout_logprob_abs_diff"]
