"""The AReaL-style GSM8K recipe: the held-apart data split, and 2 rollouts through
scripts/run-gsm8k.sh -> torchrun -> trainer.train with its flags (group 4, shaped rewards, the
decoupled loss with the behaviour weight capped at 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.grader import score_gsm8k
from recipes.gsm8k import HELDOUT, prepare

def _gsm8k_file(path: Path, n: int = HELDOUT + 12) -> Path:
    path.write_text("".join(json.dumps({"question": f"Tom has {i} apples and buys {i + 1} more. How many?",
                                        "answer": f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1:,}"}) + "\n"
                            for i in range(n)))
    return path


def test_prepare_holds_the_eval_slice_apart(tmp_path):
    counts = prepare(_gsm8k_file(tmp_path / "test.jsonl"), tmp_path / "out")
    assert counts == {"heldout": HELDOUT, "train": 12}
    train = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (tmp_path / "out" / "heldout.jsonl").read_text().splitlines()]
    assert [r["source_index"] for r in held] == list(range(HELDOUT))
    assert [r["source_index"] for r in train] == list(range(HELDOUT, HELDOUT + 12))
    i = HELDOUT + 3
    assert train[3]["label"] == str(2 * i + 1)  # the #### number, thousands comma dropped
    assert train[3]["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert score_gsm8k(f"so #### {2 * i + 1}", train[3]["label"]) == 1.0


@pytest.mark.launch
def test_run_gsm8k_through_torchrun(run_recipe, tmp_path):
    flags = ["--rollout-batch-size", "3", "--global-batch-size", "12", "--rollout-max-response-len", "10",
             "--eval-max-response-len", "6", "--max-tokens-per-gpu", "2048", "--lr", "1e-3",
             "--eval-prompt-data", "gsm8k", str(tmp_path / "data" / "gsm8k" / "heldout.jsonl@[0:4]"),
             "--sglang-max-total-tokens", "8192", "--reward-workers", "1",
             "--save-debug-rollout-data", str(tmp_path / "rollout{rollout_id}.jsonl")]
    metrics = run_recipe("run-gsm8k.sh", flags, DATA_DIR=str(tmp_path / "data"),
                         GSM8K_FILE=str(_gsm8k_file(tmp_path / "test.jsonl")))
    assert [m["step"] for m in metrics] == [1, 2] and "eval/gsm8k/score" in metrics[1]
    assert all(0.0 <= m["reward_mean"] <= 1.0 for m in metrics)  # logged raw, trained shaped
    assert all("is_masked_fraction" in m for m in metrics)
    samples = [json.loads(x) for x in (tmp_path / "rollout0.jsonl").read_text().splitlines()]
    assert len(samples) == 12 and [s["index"] // 4 for s in samples] == [0] * 4 + [1] * 4 + [2] * 4
    assert [s["reward"] for s in samples] == [score_gsm8k(s["response"], s["label"]) for s in samples]
