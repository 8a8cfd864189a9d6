"""``./scripts/quickstart.sh --task arith-tool`` as users run it: the tiny model, warmed up on
worked episodes, learns the calculator task by GRPO on multi-turn rollouts (engine sessions,
R-KV across turns): the reward rises and the tool calls' error share falls. SmolLM2 runs one
rollout of the same task with its real chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quickstart(tmp_path, *argv, timeout=1800):
    proc = subprocess.run([sys.executable, "-m", "trainer.quickstart", "--task", "arith-tool",
                           "--workdir", str(tmp_path), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[quickstart] reward mean" in proc.stdout
    return [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


@pytest.mark.launch
def test_quickstart_arith_tool_learns(tmp_path):
    rows = [r for r in _quickstart(tmp_path) if "reward_mean" in r]
    first, last = rows[:5], rows[-5:]
    # measured (seed 0): 0.062 -> 0.189; the error share of the calls 0.22 -> 0.17
    assert _mean(last, "reward_mean") > _mean(first, "reward_mean") + 0.05
    assert _mean(last, "rollout/tool_error_fraction") < 0.5  # calls mostly well-formed
    assert all(r["rollout/turns_per_sample"] > 1 for r in rows)  # the tool is called
    assert all(r["kv_compressions_per_sample"] > 0 for r in rows)
    assert all(r["rollout/observation_tokens_per_sample"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.real_model
def test_quickstart_smollm2_arith_tool_one_rollout(smollm2, tmp_path):
    (row,) = _quickstart(tmp_path, "--model", "smollm2", "--model-dir", str(smollm2),
                         "--num-rollout", "1", "--warmup-steps", "2")
    assert row["rollout/turns_per_sample"] >= 1 and "rollout/model_token_share" in row
    assert 0.0 <= row["reward_mean"] <= 1.0
