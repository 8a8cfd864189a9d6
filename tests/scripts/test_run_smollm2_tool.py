"""scripts/run-smollm2-tool.sh as shipped, end to end on a CPU: its data, its warm-up on the
multi-turn rows it writes itself, then one GRPO rollout of multi-turn episodes through torchrun.
The tiny test model stands in for SmolLM2 (MODEL_DIR) and the batch is cut by trainer flags
after the script's own (the script passes its arguments last)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.test_run_scripts import fake_gpus

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
         "--rollout-max-response-len", "64", "--sglang-dtype", "float32", "--max-tokens-per-gpu", "2048",
         "--sglang-max-total-tokens", "4096", "--sglang-max-running-requests", "8"]


@pytest.mark.launch
@pytest.mark.timeout(1800)  # 8 min (arith_tool) and 11 min (lookup_tool) on 2 cores at load ~28
# CI's launch stage runs the script as shipped (TASK=arith_tool); the lookup_tool run (the same
# script path, another environment) is also marked slow to keep the stage's margin: `-m launch` runs both
@pytest.mark.parametrize("task", ["arith_tool", pytest.param("lookup_tool", marks=pytest.mark.slow)])
def test_run_smollm2_tool_runs_end_to_end(task, tiny_model_factory, tmp_path):
    drop = ("NUM_GPUS", "TP", "PP", "SAVE_DIR", "LOG_DIR", "REF_LOAD", "DRY_RUN", "COMPRESS", "EVAL_SETS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "sglang-kvc"), os.environ.get("PYTHONPATH")) if p)
    env.update(TASK=task, MODEL_DIR=str(tiny_model_factory("qwen2.5")), DATA_DIR=str(tmp_path / "data"),
               SAVE_DIR=str(tmp_path / "save"), NUM_GPUS="1", NUM_ROLLOUT="1", WARMUP_STEPS="2",
               SAVE_INTERVAL="1", TRAIN_ROWS="64", PYTHON=sys.executable, PYTHONPATH=path, PYTHONWARNINGS="ignore",
               PATH=f"{fake_gpus(tmp_path, 0)}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "run-smollm2-tool.sh"), *SMALL], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "[warmup] 2 steps" in proc.stderr  # the warm-up took the script's own multi-turn rows
    assert (tmp_path / "save" / "model-warm" / "config.json").is_file()
    rows = [json.loads(x) for x in (tmp_path / "save" / "logs" / "metrics.jsonl").read_text().splitlines()]
    (rollout,) = [r for r in rows if "reward_mean" in r]
    assert rollout["rollout/turns_per_sample"] >= 1 and 0.0 <= rollout["reward_mean"] <= 1.0
