"""The rollout door (``rollout/side.py``): built before the learner, resumed from what a checkpoint
kept of it, opened at the learner's rollout. Servers at URLs nothing listens on: no engine starts,
so what is checked is startup and state, not generation (the loop's runs check that)."""

from __future__ import annotations

import json
import socket

import pytest

from trainer.arguments import parse_args
from trainer.rollout.config import rollout_setup_from_args
from trainer.rollout.side import RolloutSide, RolloutSpan


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def sides(tiny_model_factory, tmp_path):
    """``sides()``: a new rollout side over 5 prompts, opened at rollout 0 of 4 (closed after)."""
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"add {i} 1", "label": str(i + 1)}) + "\n"
                            for i in range(5)))
    url, built = _dead_url(), []

    def build(start: int | None = 0) -> RolloutSide:
        args = parse_args(["--hf-checkpoint", str(tiny_model_factory("qwen2.5")), "--prompt-data",
                           str(data), "--rollout-server-urls", url, "--seed", "3"])
        side = RolloutSide(rollout_setup_from_args(args), kl_loss_coef=0.0, device="cpu")
        built.append(side)
        if start is not None:
            side.open(RolloutSpan(start, 4, tmp_path, tmp_path), restart_hook=None)
        return side

    yield build
    for side in built:
        side.close()


def test_a_fresh_run_starts_at_rollout_zero_at_the_data_start(sides):
    side = sides(start=None)
    assert side.resume(None) == 0
    assert side.prompts.state() == {"epoch": 0, "offset": 0}
    assert not side.needs_reference  # no plug-in: the loss alone decides
    assert side.server_urls and side.server_urls[0].startswith("http://127.0.0.1:")


def test_a_checkpoint_state_resumes_where_the_prompts_stood(sides):
    first = sides()
    first.prompts.next_batch(7)  # past an epoch's end: the second epoch's order
    state = first.state(2)  # no rollout of this side began at 2: the stream's position now
    assert state == {"compress_budget": None, "data": {"epoch": 1, "offset": 2}}
    resumed = sides(start=None)
    assert resumed.resume({"rollout_id": 2, **state}) == 2
    resumed.open(RolloutSpan(2, 4, first.parts.eval.log_dir, first.parts.eval.log_dir), None)
    # the same prompts follow, in the same order, as in the run that was not interrupted
    assert [p.label for p in resumed.prompts.next_batch(6)] == \
        [p.label for p in first.prompts.next_batch(6)]


def test_the_state_of_a_rollout_is_where_its_prompts_began(sides):
    side = sides()
    side.parts.generate.data_states[3] = {"epoch": 0, "offset": 4}  # what generate(3) records
    side.prompts.next_batch(1)
    assert side.state(3)["data"] == {"epoch": 0, "offset": 4}
