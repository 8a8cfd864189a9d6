"""A scripted engine for the generate plug-ins' hand-computed cases: the response to a request
is a function of its prompt text (and of how many identical prompts came before it in the
call, or, for requests submitted one at a time, before it at all), with the engine's stop-string and max-token rules, so every wave can be checked."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest

from trainer.rollout.engines.interface import Backend, Generation, RolloutConfig
from trainer.rollout.samples.generate import GenerateContext
from trainer.rollout.samples.rewards import RewardConfig, RewardModel


@dataclasses.dataclass
class ScriptedBackend(Backend):
    tokenizer: object
    script: object  # (prompt_text, repeat_index) -> response text
    requests: list = dataclasses.field(default_factory=list)  # (prompt_text, params) received
    submitted: dict = dataclasses.field(default_factory=dict)  # prompt text -> submits so far

    def run(self, requests, cfg):
        seen = {}
        return [self._one(r, seen) for r in requests]

    def submit(self, request, cfg):
        """One request (an episode's turn), answered at once."""
        future = concurrent.futures.Future()
        future.set_result(self._one(request, self.submitted))
        return future

    def _one(self, r, seen: dict) -> Generation:
        text = self.tokenizer.decode(r.input_ids)
        k = seen[text] = seen.get(text, -1) + 1
        self.requests.append((text, dict(r.sampling_params)))
        return self._respond(self.script(text, k), r.sampling_params)

    def _respond(self, response: str, params: dict) -> Generation:
        finish = "stop"
        for s in params.get("stop", []):  # stop strings stay in the text (no_stop_trim)
            if s in response:
                response = response[: response.index(s) + len(s)]
        ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        if len(ids) > params["max_new_tokens"]:
            ids, finish = ids[: params["max_new_tokens"]], "length"
        return Generation(ids, [-0.5] * len(ids), self.tokenizer.decode(ids), finish, "v0", {})


@pytest.fixture
def scripted():
    """``scripted(script, mode=..., max_response_len=..., context_length=...) -> (ctx, backend)``."""
    from checkpoint_tools.tiny_models import train_tokenizer

    tokenizer = train_tokenizer()
    models = []

    def make(script, mode="train", max_response_len=256, context_length=None, rm_type="arithmetic"):
        backend = ScriptedBackend(tokenizer, script)
        rewards = RewardModel(RewardConfig(rm_type=rm_type))
        models.append(rewards)
        ctx = GenerateContext(backend, RolloutConfig(max_response_len=max_response_len, seed=7),
                              tokenizer, rewards, mode=mode,
                              context_length=context_length)
        return ctx, backend

    yield make
    for m in models:
        m.close()


@pytest.fixture
def run_recipe(tiny_model_factory, tmp_path):
    """``run_recipe(script, flags, **env) -> metrics rows``: scripts/<script> through torchrun on
    one CPU rank with a tiny Qwen2.5, 2 rollouts (eval at 2), saving under ``tmp_path/run``."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def run(script: str, flags: list[str], **env_vars) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
        env.update(NUM_GPUS="1", MODEL_DIR=str(tiny_model_factory("qwen2.5")),
                   SAVE_DIR=str(tmp_path / "run"), NUM_ROLLOUT="2", EVAL_INTERVAL="2",
                   TORCHRUN=f"{sys.executable} -m torch.distributed.run", PYTHONWARNINGS="ignore",
                   **env_vars)
        proc = subprocess.run(["bash", str(root / "scripts" / script), *flags], env=env, cwd=root,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        log = tmp_path / "run" / "logs" / "metrics.jsonl"
        return [json.loads(x) for x in log.read_text().splitlines()]

    return run
