"""The Countdown recipe: its reward plug-ins against hand-computed cases (malformed outputs
included), the data generator's split and solvability, and 2 rollouts through
scripts/run-countdown.sh -> torchrun -> trainer.train with the plug-in as the reward."""

from __future__ import annotations

import json

import pytest

from dataset.countdown_r1 import make_rows, split_of
from recipes.countdown import reward, reward_binary
from trainer.rollout.samples.rewards import RewardInput

LABEL = json.dumps({"target": 16, "numbers": [3, 5, 2]})


@pytest.mark.parametrize("response,expected,binary", [
    ("<think>3+5=8, 8*2=16</think>\n<answer>(3 + 5) * 2</answer>", 1.0, 1.0),
    ("<answer> 2 * (5 + 3) = 16 </answer>", 1.0, 1.0),            # "= target" tail allowed
    ("<answer>(3 + 5) * 2</answer> wait <answer>3 * 5 + 2</answer>", 0.1, 0.0),  # last tag counts
    ("<answer>3 * 5 + 2</answer>", 0.1, 0.0),                      # 17: formatted, wrong
    ("<answer>(3 + 3) * 2</answer>", 0.1, 0.0),                    # 3 twice, 5 unused
    ("<answer>(3 + 5) * 2 * 1</answer>", 0.1, 0.0),                # 1 is not given
    ("<answer>3 / (5 - 5) + 2</answer>", 0.1, 0.0),                # 5 twice; and / 0
    ("<answer>2 / (3 - 3) * 5</answer>", 0.1, 0.0),
    ("<answer>" + "9" * 5000 + "</answer>", 0.1, 0.0),             # huge number: capped, no parse
    ("<answer>__import__('os').system('x')</answer>", 0.1, 0.0),   # never evaluated
    ("<answer>2 ** 5 - 3 - 5</answer>", 0.1, 0.0),                 # ** is not allowed
    ("<answer>(3 + 5) * 2", 0.0, 0.0),                             # unbalanced: no answer
    ("(3 + 5) * 2", 0.0, 0.0),                                     # no tags at all
    ("", 0.0, 0.0),
])
def test_reward_cases(response, expected, binary):
    sample = RewardInput(prompt="p", response=response, label=LABEL)
    assert reward(sample) == expected
    assert reward_binary(sample) == binary


def test_division_by_zero_with_the_right_numbers_is_format_only():
    label = json.dumps({"target": 4, "numbers": [2, 2, 5]})
    assert reward(RewardInput("p", "<answer>5 / (2 - 2)</answer>", label)) == 0.1
    assert reward(RewardInput("p", "<answer>(5 - 2 / 2) * 1</answer>", label)) == 0.1  # 1 not given
    assert reward(RewardInput("p", "<answer>2 * 2 + 5 - 5</answer>", label)) == 0.1


def test_data_split_is_disjoint_and_every_task_solvable():
    train, test = make_rows("train", 400, 0, chat=False), make_rows("test", 60, 1, chat=True)
    key = lambda r: (tuple(sorted(json.loads(r["label"])["numbers"])), json.loads(r["label"])["target"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert len({key(r) for r in train}) == 400
    assert make_rows("train", 50, 0, chat=False) == train[:50]  # seeded
    for r in train + test:
        spec = json.loads(r["label"])
        assert 3 <= len(spec["numbers"]) <= 4 and all(1 <= n <= 100 for n in spec["numbers"])
        assert 1 <= spec["target"] <= 100
        assert split_of(spec["numbers"], spec["target"]) == ("train" if r in train else "test")
        assert reward(RewardInput("p", f"<answer>{r['solution']}</answer>", r["label"])) == 1.0
    assert train[0]["prompt"].endswith("Assistant: Let me solve this step by step.\n<think>")
    assert test[0]["prompt"][1]["role"] == "user" and "<answer>" in test[0]["prompt"][1]["content"]


@pytest.mark.launch
def test_run_countdown_through_torchrun(run_recipe, tmp_path):
    flags = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8",
             "--rollout-max-response-len", "12", "--eval-max-response-len", "8",
             "--eval-prompt-data", "countdown", str(tmp_path / "data" / "countdown" / "test.jsonl@[0:4]"),
             "--max-tokens-per-gpu", "2048", "--sglang-max-total-tokens", "8192", "--lr", "1e-3",
             "--save-debug-rollout-data", str(tmp_path / "rollout{rollout_id}.jsonl")]
    metrics = run_recipe("run-countdown.sh", flags, DATA_DIR=str(tmp_path / "data"))
    assert [m["step"] for m in metrics] == [1, 2] and "eval/countdown/score" in metrics[1]
    for rollout in (0, 1):
        samples = [json.loads(x) for x in (tmp_path / f"rollout{rollout}.jsonl").read_text().splitlines()]
        assert len(samples) == 8
        assert [s["reward"] for s in samples] == [
            reward(RewardInput(s["prompt"], s["response"], s["label"])) for s in samples]
        assert all(s["prompt"].endswith("<think>") for s in samples)
