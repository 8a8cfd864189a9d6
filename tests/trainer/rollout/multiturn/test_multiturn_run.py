"""A multi-turn training run as users launch it (``--env-path``): three turns per sample, the
dense π_old recompute over the concatenated context equals the sampler on every model token
(the mismatch metrics, over model tokens only, at the numerics floor); bad multi-turn flags
fail at once, naming the flag; under R-KV across turns (the first prompt or every turn's
pinned) the eviction record's replay equals the sampler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.test_train_loop import _flags, _metrics, _run, setup  # noqa: F401 (fixture)

ENV = f"{Path(__file__).with_name('scripted_env.py')}:echo"
MULTITURN = ["--env-path", ENV, "--max-turns", "3", "--max-tokens-per-turn", "8"]


def _one_step(hf, data, out, *extra):
    flags = _flags(hf, data, out, *MULTITURN, *extra, rollouts=1)
    flags[flags.index("--global-batch-size") + 1] = "16"  # the whole rollout: one step
    flags[flags.index("--rollout-max-response-len") + 1] = "96"
    rc, log = _run(flags)
    assert rc == 0, log[-3000:]
    return _metrics(out)[0]


@pytest.mark.launch
def test_dense_recompute_equals_the_sampler_over_turns(setup, tmp_path):  # noqa: F811
    hf, data, _ = setup
    row = _one_step(hf, data, tmp_path)
    assert row["rollout/turns_per_sample"] == 3.0
    assert row["rollout/tool_calls_per_sample"] == 2.0
    assert row["rollout/observation_tokens_per_sample"] > 0
    assert 0 < row["rollout/model_token_share"] < 1
    assert row["train_rollout_logprob_abs_diff"] < 1e-5, row["train_rollout_logprob_abs_diff"]
    assert abs(row["k3_kl"]) < 1e-9, row["k3_kl"]


@pytest.mark.parametrize("extra,message", [
    (["--env-path", "no.such.module:Env"], "--env-path 'no.such.module:Env': cannot import"),
    (["--env-path", ENV, "--custom-generate-function-path", "recipes.rc:ReasoningCache"],
     "--env-path runs its own generate loop"),
    (["--env-path", ENV, "--max-turns", "0"], "--max-turns must be >= 1"),
    (["--env-path", ENV, "--tool-parser", "bogus"], "--tool-parser 'bogus'"),
    (["--env-path", ENV, "--env-args", "x=1"], "is a function; --env-args need a class"),
])
def test_bad_multiturn_flags_fail_at_once(setup, tmp_path, extra, message):  # noqa: F811
    hf, data, _ = setup
    rc, log = _run(_flags(hf, data, tmp_path, *extra), timeout=120)
    assert rc == 2 and message in log, log[-2000:]
    assert "Traceback" not in log


RKV = ["--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "8",
       "--sglang-compress-divide-length", "2", "--sglang-compress-max-window", "2"]


@pytest.mark.launch
def test_eviction_replay_over_turns_is_the_sampler(setup, tmp_path):  # noqa: F811
    """R-KV across turns in engine sessions: replaying the last turn's eviction record (it spans
    the whole context) recomputes every model token's log-prob as the compressed sampler had it,
    observations evicted and attended as they were; the dense recompute is far off."""
    hf, data, _ = setup
    sparse = _one_step(hf, data, tmp_path / "sparse", *RKV, "--sparse-recompute",
                       "--train-sparse-policy")
    assert sparse["rollout/turns_per_sample"] == 3.0
    assert sparse["kv_compressions_per_sample"] > 0
    assert sparse["train_rollout_logprob_abs_diff"] < 1e-5, sparse["train_rollout_logprob_abs_diff"]
    assert abs(sparse["train/ppo_kl"]) < 1e-6, sparse["train/ppo_kl"]
    dense = _one_step(hf, data, tmp_path / "dense", *RKV)
    assert dense["train_rollout_logprob_abs_diff"] > 1e-3


# each turn's budget counts that turn's outputs only (8 a turn here): B 4 + N 2 compress in turn
PIN_TURNS = ["--sglang-compress-algorithm", "rkv", "--sglang-compress-max-prompt", "4",
             "--sglang-compress-divide-length", "2", "--sglang-compress-max-window", "2",
             "--sglang-compress-keep-prompt", "--sglang-compress-pin-turns"]


@pytest.mark.launch
def test_eviction_replay_with_pinned_turns_is_the_sampler(setup, tmp_path):  # noqa: F811
    """--sglang-compress-pin-turns: every turn's prompt (observations included) is pinned, each
    turn's outputs compressed; the replay of the record still recomputes the sampler's
    log-probs exactly."""
    hf, data, _ = setup
    sparse = _one_step(hf, data, tmp_path, *PIN_TURNS, "--sparse-recompute", "--train-sparse-policy")
    assert sparse["rollout/turns_per_sample"] == 3.0
    assert sparse["kv_compressions_per_sample"] > 0
    assert sparse["train_rollout_logprob_abs_diff"] < 1e-5, sparse["train_rollout_logprob_abs_diff"]
    assert abs(sparse["train/ppo_kl"]) < 1e-6, sparse["train/ppo_kl"]
