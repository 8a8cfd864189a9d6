"""Training rewards: bias, scaling and the over-long penalty per trace; truncated calls filtered."""

from __future__ import annotations

import pytest

from trainer.arguments import parse_args
from trainer.rollout.engines.interface import Generation
from trainer.rollout.config import rollout_setup_from_args
from trainer.rollout.samples.shaping import training_rewards
from trainer.rollout.samples.traces import Call, Trace


@pytest.fixture
def flags(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return ["--hf-checkpoint", str(tmp_path), "--prompt-data", _prompt_file(tmp_path),
            "--rollout-max-response-len", "10"]


def _trace(reward, *lengths, finish="stop"):
    calls = [Call([1], Generation([7] * n, [0.0] * n, "", finish, None, {})) for n in lengths]
    return Trace(calls, "", 0, reward=reward)


def test_penalty_bias_and_scaling(flags):
    plan = rollout_setup_from_args(parse_args(
        [*flags, "--overlong-buffer-len", "4", "--overlong-penalty-factor", "2",
         "--reward-bias", "0.5", "--reward-scaling", "2"])).plan
    # L = 10, B = 4: free up to 6; 8 tokens -> -(2/4)*2 = -1; 10 tokens -> -2
    traces = [_trace(1.0, 3), _trace(1.0, 8), _trace(0.0, 10, finish="length"),
              _trace(1.0, 9, 2)]  # a two-call trace is judged by its last call (2 tokens)
    shaped = training_rewards(traces, plan)
    assert shaped.rewards.tolist() == [3.0, 1.0, -3.0, 3.0]  # (r + penalty + 0.5) * 2
    assert shaped.keep is None  # filtering is off
    assert shaped.metrics["rollout/overlong_penalty_mean"] == pytest.approx(-0.75)


def test_filtering_drops_truncated_calls(flags):
    plan = rollout_setup_from_args(parse_args([*flags, "--overlong-filtering"])).plan
    traces = [_trace(1.0, 3), _trace(0.0, 10, finish="length"), _trace(1.0, 4)]
    shaped = training_rewards(traces, plan)
    assert shaped.keep.tolist() == [True, False, True]
    assert shaped.rewards.tolist() == [1.0, 0.0, 1.0]  # no penalty without a buffer
    assert shaped.metrics["rollout/overlong_filtered"] == 1.0


@pytest.mark.parametrize("extra, flag", [(["--overlong-buffer-len", "10"], "--overlong-buffer-len"),
                                         (["--overlong-penalty-factor", "-1"],
                                          "--overlong-penalty-factor")])
def test_bad_flags_name_themselves(flags, extra, flag, capsys):
    with pytest.raises(SystemExit):
        parse_args([*flags, *extra])
    assert flag in capsys.readouterr().err


def _prompt_file(tmp_path) -> str:
    """--prompt-data must name a file that exists (checked when the flags are parsed)."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "p", "label": "1"}\n')
    return str(path)
