"""docs/environments.md's examples run as written: its ``my_env.py``, ``my_tools.py`` and the
``check_my_tools.py`` that tests the tool environment on a hand-built ``Conversation`` are taken
from the page, written to a folder and run there, as a reader would (issue 70). A tool
environment without ``reward`` is refused when the run loads it, naming the class."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
PAGE = ROOT / "docs" / "environments.md"
BLOCK = re.compile(r"```python\n# (\S+\.py) -- (.*?)```", re.S)


def _examples() -> dict[str, str]:
    """The page's Python examples by the file name their first line gives."""
    return {name: f"# {name} -- {body}" for name, body in BLOCK.findall(PAGE.read_text())}


def test_the_page_has_its_three_examples():
    assert {"my_env.py", "my_tools.py", "check_my_tools.py"} <= set(_examples())


def test_the_hand_built_conversation_check_runs_as_written(tmp_path):
    for name, code in _examples().items():
        (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "sglang-kvc")])}
    out = subprocess.run([sys.executable, "check_my_tools.py"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "UnitsEnv: the call answered, the final answer scored 1.0"


def test_the_guess_the_number_example_loads_and_answers(tmp_path, monkeypatch):
    from trainer.rollout.multiturn.environment import Conversation, load_environment
    from trainer.rollout.samples.data import Prompt

    (tmp_path / "my_env.py").write_text(_examples()["my_env.py"])
    monkeypatch.chdir(tmp_path)
    step = load_environment("my_env.py:GuessTheNumber", {"secret_max": 100})
    prompt = Prompt("guess", [], None, {})
    secret = hash("guess") % 100
    assert step(Conversation(prompt, [f"it is {secret}"], [])).reward == 1.0
    wrong = (secret + 1) % 100
    assert step(Conversation(prompt, [f"it is {wrong}"], [])).observation in ("higher", "lower")


def test_a_tool_environment_without_reward_is_refused_at_load_time(tmp_path, monkeypatch):
    from trainer.rollout.multiturn.environment import load_environment

    (tmp_path / "no_reward.py").write_text(
        "from trainer.rollout.multiturn.environment import ToolEnvironment\n"
        "class NoReward(ToolEnvironment):\n    tools = {}\n"
        "class ByTheRun(ToolEnvironment):\n    def reward(self, conversation):\n        return None\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"--env-path 'no_reward.py:NoReward': NoReward defines "
                                         r"no reward\(conversation\)"):
        load_environment("no_reward.py:NoReward", {})
    assert callable(load_environment("no_reward.py:ByTheRun", {}))  # None on purpose: allowed
