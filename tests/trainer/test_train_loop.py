"""End-to-end runs of ``python -m trainer.train`` on a tiny model (CPU): in-process engine,
HTTP server, resume, weight-sync consistency, bad data and bad flags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

from checkpoint_tools import cpu_megatron

ROOT = Path(__file__).resolve().parents[2]


def _task_rows(n=64):
    rows = []
    for i in range(n):
        a, b = i % 9 + 1, (i * 7) % 7 + 3
        rows.append({"prompt": f"<|im_start|>user\nadd {a} {b}<|im_end|>\n<|im_start|>assistant\n",
                     "label": str(a + b)})
    return rows


@pytest.fixture(scope="module")
def setup(tiny_model_factory, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _task_rows()))
    return tiny_model_factory("qwen2.5"), data, tmp


def _flags(hf, data, out, *extra, rollouts=2):
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(data), "--save", str(out / "ckpt"),
            "--log-dir", str(out / "logs"), "--num-rollout", str(rollouts),
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "8",
            "--rollout-max-response-len", "12", "--lr", "1e-3", "--kl-loss-coef", "0",
            "--rm-type", "math", "--max-tokens-per-gpu", "512", "--seed", "7",
            "--sglang-max-total-tokens", "4096", "--reward-workers", "1", *extra]


def _run(argv, timeout=600):
    """A training run in its own process (as users run it); returns (rc, combined output)."""
    proc = subprocess.run([sys.executable, "-m", "trainer.train", *argv], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**__import__("os").environ, "PYTHONWARNINGS": "ignore"})
    return proc.returncode, proc.stdout + proc.stderr


def _metrics(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_in_process_run_with_rkv_and_correction(setup, tmp_path):
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, "--sglang-compress-algorithm", "rkv",
                          "--sglang-compress-max-prompt", "4", "--sglang-compress-divide-length",
                          "2", "--sglang-compress-max-window", "2", rollouts=2))
    assert rc == 0, log[-3000:]
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["kv_compressions_per_sample"] > 0  # the sampler really was sparse
        assert 0.0 <= r["rejected_fraction"] <= 1.0 and "ess" in r
        assert r["time_rollout"] > 0 and r["time_update"] > 0
        # this rollout's decode steps (not the engine's lifetime): at least the longest response
        # needs (its first token comes from prefill), at most one a generated token
        samples = r["rollout_engine0/samples"]
        assert r["response_len_max"] - 1 <= r["rollout/decode_steps"] <= r["response_len_mean"] * samples
        assert r["rollout/decode_ms_per_step"] > 0 and r["rollout/graph_captures"] == 0  # CPU: no graphs
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (tmp_path / "logs" / "reward.png").is_file()
    assert "time split" in log


@pytest.mark.launch
def test_dense_weight_sync_keeps_engine_and_trainer_identical(setup, tmp_path):
    """Dense rollouts: the trainer's recomputed π_old equals the engine's logprobs, at the first
    rollout (same checkpoint) and after every sync (same updated weights)."""
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, rollouts=3))
    assert rc == 0, log[-3000:]
    rows = _metrics(tmp_path)
    assert len(rows) == 3
    for r in rows:
        assert r["train_rollout_logprob_abs_diff"] < 1e-4, r["train_rollout_logprob_abs_diff"]
    assert rows[0]["sync_bytes"] > 0


@pytest.mark.launch
def test_first_update_starts_on_policy(setup, tmp_path):
    """slime's first-step check: dense rollouts, one optimizer step per rollout, π_old recomputed
    from the same weights: the first step's PPO KL is 0 (π_θ = π_old) and the engine-vs-trainer
    log-prob difference is at its floor (fp32: ~1e-7)."""
    hf, data, _ = setup
    flags = _flags(hf, data, tmp_path, rollouts=1)
    flags[flags.index("--global-batch-size") + 1] = "16"  # the whole rollout: one step
    rc, log = _run(flags)
    assert rc == 0, log[-3000:]
    row = _metrics(tmp_path)[0]
    assert abs(row["train/ppo_kl"]) < 1e-6, row["train/ppo_kl"]
    assert row["train/clipfrac"] == 0.0
    assert row["train_rollout_logprob_abs_diff"] < 1e-5, row["train_rollout_logprob_abs_diff"]
    assert row["old_logp_fused"] == 1.0 and "π_old from the update's forward (fused)" in log


def test_fused_old_logprobs_equal_the_recompute_in_the_loop(setup, tmp_path):
    """One on-policy step with R-KV rollouts and the reference's correction (batch-normalised,
    rejecting): π_old from the update's forward gives the recompute's step and metrics."""
    hf, data, _ = setup
    rows = {}
    for fused in ("--fused-old-logprobs", "--no-fused-old-logprobs"):
        out = tmp_path / fused
        flags = _flags(hf, data, out, fused, "--sglang-compress-algorithm", "rkv",
                       "--sglang-compress-max-prompt", "4", "--sglang-compress-divide-length", "2",
                       "--sglang-compress-max-window", "2", "--mis-upper-bound", "1.02", rollouts=1)
        flags[flags.index("--global-batch-size") + 1] = "16"
        rc, log = _run(flags)
        assert rc == 0, log[-3000:]
        rows[fused] = _metrics(out)[0]
    fused, recompute = rows["--fused-old-logprobs"], rows["--no-fused-old-logprobs"]
    assert fused.pop("old_logp_fused") == 1.0 and recompute.pop("old_logp_fused") == 0.0
    assert recompute["rejected_fraction"] > 0 and recompute["batch_norm_factor"] != 1.0
    for key, value in recompute.items():
        if not key.startswith(("time", "rollout", "sync", "eval", "perf")) and isinstance(value, float):
            assert fused[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


@pytest.mark.launch
def test_resume_equals_uninterrupted(setup, tmp_path):
    hf, data, _ = setup
    full, half = tmp_path / "full", tmp_path / "half"
    rc, log = _run(_flags(hf, data, full, rollouts=3))
    assert rc == 0, log[-3000:]
    rc, log = _run(_flags(hf, data, half, "--save-interval", "1", rollouts=2))
    assert rc == 0, log[-3000:]
    rc, log = _run(_flags(hf, data, half, "--load", str(half / "ckpt"), rollouts=3))
    assert rc == 0, log[-3000:]
    a, b = _metrics(full), _metrics(half)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward_mean", "response_len_mean", "train/loss", "train/grad_norm"):
        assert b[2][key] == pytest.approx(a[2][key], abs=1e-6), key


@pytest.mark.launch
@pytest.mark.parametrize("sync", ["tensor", "ipc", "disk", "distributed"])
def test_http_server_backend(setup, tmp_path, sync, wait_healthy):
    """Rollouts from a separate sglang-kvc server; every weight-sync transport must leave the
    server serving exactly the trainer's weights (π_old recompute == server logprobs)."""
    hf, data, _ = setup
    port = cpu_megatron.free_port()
    server = subprocess.Popen([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                               str(hf), "--port", str(port), "--max-total-tokens", "4096"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        rc, log = _run(_flags(hf, data, tmp_path, "--rollout-server-urls", url,
                              "--weight-sync", sync, rollouts=2))
        assert rc == 0, log[-3000:]
        rows = _metrics(tmp_path)
        assert len(rows) == 2 and all(r["train_rollout_logprob_abs_diff"] < 1e-4 for r in rows)
        assert requests.get(url + "/get_weight_version", timeout=5).json()["weight_version"] == "rollout-2"
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("content,message", [
    ("", "no rows"),
    ('{"prompt": "hi", "label": "1"}\n{"prompt": "broken",\n', ":2: not valid JSON"),
    ('{"prompt": "hi", "label": "1"}\n{"question": "x", "label": "2"}\n', ":2: missing key 'prompt'"),
    ('{"prompt": "hi"}\n', ":1: missing key 'label'"),
])
def test_bad_data_names_file_and_line(setup, tmp_path, content, message):
    hf, _, _ = setup
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    rc, log = _run(_flags(hf, bad, tmp_path))
    assert rc != 0 and str(bad) in log and message in log, log[-2000:]
    assert "Traceback" not in log


@pytest.mark.parametrize("extra,message", [
    (["--global-batch-size", "5"], "--global-batch-size 5 must divide"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--sglang-compress-algorithm", "bogus"], "--sglang-compress-algorithm"),
    (["--weight-sync", "tensor"], "--weight-sync tensor needs --rollout-server-urls"),
    (["--rollout-top-p", "0.9"], "--rollout-top-p 0.9 / --rollout-top-k -1: truncated sampling"),
    (["--rollout-top-k", "20"], "--rollout-top-k 20: truncated sampling is not supported"),
    (["--rollout-engine-process", "--rollout-server-urls", "http://127.0.0.1:1"],
     "--rollout-engine-process starts the engines itself"),
    (["--rollout-engine-process", "--weight-sync", "inprocess"],
     "--weight-sync inprocess needs the in-process engine"),
    (["--max-staleness", "1", "--partial-rollout", "--sparse-recompute"],
     "--partial-rollout with --sparse-recompute / --train-sparse-policy is not supported"),
])
def test_bad_flags_fail_at_once(setup, tmp_path, extra, message):
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, *extra), timeout=120)
    assert rc == 2 and message in log, log[-2000:]


@pytest.mark.launch
def test_rkv_run_evaluates_as_trained_and_dense(setup, tmp_path):
    """--eval-compression both: every evaluation runs twice on the rollout engine, with its R-KV
    and with dense KV (per-request compress: false); pass@n with several samples; the startup
    line says how many samples the pool holds, dense and compressed."""
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, "--sglang-compress-algorithm", "rkv",
                          "--sglang-compress-max-prompt", "4", "--sglang-compress-divide-length",
                          "2", "--sglang-compress-max-window", "2", "--eval-prompt-data", "t",
                          str(data), "--eval-interval", "1", "--eval-compression", "both",
                          "--n-samples-per-eval-prompt", "2", "--eval-temperature", "1.0", "0",
                          "--eval-before-train", rollouts=1))
    assert rc == 0, log[-3000:]
    start, row = _metrics(tmp_path)[0], _metrics(tmp_path)[-1]
    for prefix in ("eval/t", "eval/t_dense"):
        assert 0.0 <= row[f"{prefix}/score"] <= 1.0 and row[f"{prefix}/response_len"] > 0
        assert row[f"{prefix}/score"] <= row[f"{prefix}/pass@2"] <= 1.0
    # the greedy pass (one sample per prompt: no pass@n) and the starting policy as step 0
    for prefix in ("eval/t_t0", "eval/t_t0_dense"):
        assert 0.0 <= row[f"{prefix}/score"] <= 1.0 and f"{prefix}/pass@2" not in row
    assert start["step"] == 0 and "eval/t_dense/pass@2" in start and "reward_mean" not in start
    samples = tmp_path / "logs" / "eval_samples"
    assert {p.name.split("_rollout")[0] for p in samples.glob("*.jsonl")} == {"t", "t_dense", "t_t0", "t_t0_dense"}
    # 4096 slots; prompts of ~20 tokens + 12: dense ~128 samples, R-KV bound max(P + 1, 4 + 2)
    assert "samples of" in log and "at once dense" in log and "with rkv 4+2" in log, \
        [line for line in log.splitlines() if "KV pool" in line]


PARITY_REWARD = "def reward(item):\n    return float(len(item.response) % 2)\n"


@pytest.mark.launch
def test_dynamic_sampling_and_overlong_shaping(setup, tmp_path):
    """DAPO's batch shaping through the whole loop: every trained group has reward variance
    (the filter's rounds fill the batch), over-long responses are penalised and filtered."""
    hf, data, _ = setup
    (tmp_path / "parity.py").write_text(PARITY_REWARD)
    rc, log = _run(_flags(hf, data, tmp_path, "--custom-rm-path", f"{tmp_path / 'parity.py'}:reward",
                          "--dynamic-sampling-filter-path", "reward_nonzero_std",
                          "--over-sampling-batch-size", "3", "--overlong-buffer-len", "4",
                          "--overlong-filtering", "--save-debug-rollout-data",
                          str(tmp_path / "rows_{rollout_id}.jsonl"), rollouts=1))
    assert rc == 0, log[-3000:]
    row = _metrics(tmp_path)[-1]
    assert row["rollout/groups_kept"] == 4
    assert row["rollout/groups_generated"] == 3 * row["rollout/sampling_rounds"]
    assert row["rollout/groups_generated"] == 4 + row["rollout/groups_dropped"] + \
        row["rollout/groups_surplus"]
    rows = [json.loads(x) for x in (tmp_path / "rows_0.jsonl").read_text().splitlines()]
    assert len(rows) == 16
    for g in range(4):
        assert len({r["reward"] for r in rows[4 * g: 4 * g + 4]}) == 2
    assert row["rollout/overlong_penalty_mean"] <= 0 and "rollout/overlong_filtered" in row


def _same_run_keys(row: dict) -> dict:
    """The metrics that do not measure time (equal between two runs that compute the same)."""
    return {k: v for k, v in row.items()
            if not (k.startswith(("time_", "perf/")) or "per_s" in k or k.startswith("rollout/staleness")
                    or k.endswith(("_s", "_ms_per_step"))  # rollout/decode_host_s, ...
                    or k in ("rollout/interruptions", "rollout/partial_samples", "rollout_tail_fraction"))}


def _rows(out, rollouts):
    return [[json.loads(x) for x in (out / f"rows_{r}.jsonl").read_text().splitlines()]
            for r in range(rollouts)]


@pytest.mark.launch
def test_async_with_staleness_zero_is_the_synchronous_run(setup, tmp_path):
    """--max-staleness 0: the generation thread generates each rollout under the weights it
    trains, so samples, log-probs, rewards, losses and the trained weights are the synchronous
    run's, bit for bit."""
    hf, data, _ = setup
    runs = {}
    for name, extra in (("sync", []), ("async", ["--max-staleness", "0", "--partial-rollout"])):
        out = tmp_path / name
        rc, log = _run(_flags(hf, data, out, "--save-debug-rollout-data",
                              str(out / "rows_{rollout_id}.jsonl"), *extra, rollouts=3))
        assert rc == 0, log[-3000:]
        runs[name] = out
    sync, asyn = (_metrics(runs[k]) for k in ("sync", "async"))
    assert [_same_run_keys(r) for r in sync] == [_same_run_keys(r) for r in asyn]
    assert all(r["rollout/staleness_max"] == 0 and r["rollout/staleness_0"] == 1.0 for r in asyn)
    assert _rows(runs["sync"], 3) == _rows(runs["async"], 3)
    weights = [_checkpoint_tensors(runs[k] / "ckpt" / "iter_0000003", tmp_path / f"{k}.pt")
               for k in ("sync", "async")]
    assert weights[0].keys() == weights[1].keys() and len(weights[0]) > 0
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def _checkpoint_tensors(ckpt_dir, scratch):
    """Every tensor of a torch_dist checkpoint (weights and optimizer state), by key."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(ckpt_dir), str(scratch))
    flat = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)

    walk("", torch.load(scratch, weights_only=False))
    return flat


@pytest.mark.launch
@pytest.mark.parametrize("layout", [[], pytest.param(["--rollout-engine-process"], marks=pytest.mark.slow)],
                         ids=["in-process", "engine-process"])
def test_async_partial_rollouts_stay_within_the_bound(setup, tmp_path, layout):
    """--max-staleness 1 --partial-rollout with R-KV, on the in-process engine and on an engine
    process (interrupted over HTTP: /abort_request): long responses keep the next rollout in
    flight when the weights are pushed, so requests are interrupted and resumed; every sample
    comes back once, with one version per token, none more than one version behind."""
    hf, data, _ = setup
    flags = _flags(hf, data, tmp_path, *layout, "--max-staleness", "1", "--partial-rollout",
                   "--save-debug-rollout-data", str(tmp_path / "rows_{rollout_id}.jsonl"),
                   "--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "4",
                   "--sglang-compress-divide-length", "2", "--sglang-compress-max-window", "2",
                   rollouts=3)
    for flag, value in (("--rollout-max-response-len", "300"), ("--max-tokens-per-gpu", "4096"),
                        ("--sglang-max-total-tokens", "8192")):
        flags[flags.index(flag) + 1] = value
    rc, log = _run(flags)
    assert rc == 0, log[-3000:]
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0 <= r["rollout/staleness_max"] <= 1
        assert sum(v for k, v in r.items() if k[len("rollout/staleness_"):].isdigit()) == \
            pytest.approx(1.0)
    assert rows[-1]["rollout/interruptions"] >= 1 and sum(r["rollout/partial_samples"] for r in rows) > 0
    for r, samples in enumerate(_rows(tmp_path, 3)):
        assert len(samples) == 16  # each sample once, interrupted or not
        for s in samples:
            assert 0 < len(s["response_ids"]) <= 300 and len(s["logprobs"]) == len(s["response_ids"])
            versions = s["token_versions"]
            if versions is not None:  # resumed: older tokens first, at most one version behind
                assert len(versions) == len(s["response_ids"]) and versions == sorted(versions)
                assert r - 1 <= versions[0] < versions[-1] <= r


@pytest.mark.launch
def test_engine_process_generates_while_training_and_gets_every_push(setup, tmp_path):
    """--rollout-engine-process --max-staleness 1: the engine runs as a child process of the
    trainer, generates the next rollout while the current one trains, and serves exactly the
    weights each push sent (a --max-staleness 0 run's pi_old recompute equals its log-probs);
    no engine process outlives the run."""
    hf, data, _ = setup
    runs = {}
    for bound in ("0", "1"):
        out = tmp_path / bound
        rc, log = _run(_flags(hf, data, out, "--rollout-engine-process", "--max-staleness", bound,
                              rollouts=3))
        assert rc == 0, log[-3000:]
        assert "start the rollout engine process(es)" in log and "http://127.0.0.1:" in log
        runs[bound] = _metrics(out)
        engine_log = (out / "logs" / "engines" / "engine0.log").read_text()
        assert "POST /update_weights_from_tensor" in engine_log  # every push reached it
    assert all(r["train_rollout_logprob_abs_diff"] < 1e-4 for r in runs["0"])
    assert all(r["rollout/staleness_max"] == 0 for r in runs["0"])
    assert [r["step"] for r in runs["1"]] == [1, 2, 3]
    assert any(r["rollout/staleness_max"] == 1 for r in runs["1"][1:])
    leftover = subprocess.run(["pgrep", "-f", f"sglang_kvc.launch_server --model-path {hf}"],
                              capture_output=True, text=True).stdout.split()
    assert leftover == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs an engine that cannot start: CUDA on a CPU-only torch")
def test_engine_process_that_cannot_start_is_an_error_naming_its_log(setup, tmp_path):
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, "--rollout-engine-process", "--sglang-device", "cuda"),
                   timeout=180)
    assert rc == 2, log[-2000:]
    assert "trainer.train: error: --rollout-engine-process: rollout engine 0" in log
    assert str(tmp_path / "logs" / "engines" / "engine0.log") in log
