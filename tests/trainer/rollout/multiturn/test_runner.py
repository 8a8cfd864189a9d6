"""Episodes advance on their own (``multiturn/runner.py``): no barrier per turn. By
construction: sample 0's environment holds its turn-1 answer until another sample's turn 2 has
been submitted to the engine, which only a loop without a per-turn barrier can do (a loop that
waits for every turn 1 to be answered first never submits that turn 2, and the event never
fires). Then the episodes are what a turn-by-turn loop would build: tokens, mask, log-probs."""

from __future__ import annotations

import concurrent.futures
import threading

from trainer.rollout.engines.interface import Backend, Generation, RolloutConfig
from trainer.rollout.multiturn.environment import Step
from trainer.rollout.multiturn.loop import MultiTurn
from trainer.rollout.samples.data import Prompt
from trainer.rollout.samples.generate import GenerateContext

OBSERVATION = [7, 7]  # token ids of every observation


class Tokens:
    """A tokenizer of token ids written as space-separated numbers."""

    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class Echo(Backend):
    """Answers each request at once with three tokens: the request's length, 1, 2; records the
    turn (how many observations its context holds) of every request submitted."""

    def __init__(self):
        self.turns: list[int] = []
        self.turn2 = threading.Event()  # some sample's turn 2 was submitted

    def submit(self, request, cfg):
        turn = _count(request.input_ids, OBSERVATION) + 1
        self.turns.append(turn)
        if turn == 2:
            self.turn2.set()
        ids = [len(request.input_ids), 1, 2]
        future = concurrent.futures.Future()
        future.set_result(Generation(ids, [-0.25] * 3, " ".join(map(str, ids)), "stop", "v0", {}))
        return future


def _count(ids: list[int], sub: list[int]) -> int:
    return sum(ids[i:i + len(sub)] == sub for i in range(len(ids)))


class HoldSampleZero:
    """Two turns each; sample 0's first answer waits for another sample's turn 2."""

    def __init__(self, backend: Echo):
        self.backend, self.saw_turn2 = backend, None

    def step(self, conversation) -> Step:
        if len(conversation.turns) == 2:
            return Step(done=True, reward=1.0)
        if conversation.sample_index == 0:  # a bound only so that a barrier fails, not hangs
            self.saw_turn2 = self.backend.turn2.wait(timeout=60)
        return Step(" ".join(map(str, OBSERVATION)), tool_calls=1)


def _run(n: int = 3):
    backend = Echo()
    env = HoldSampleZero(backend)
    ctx = GenerateContext(backend, RolloutConfig(max_response_len=64, seed=1), Tokens(), None)
    prompt = Prompt("p", [5, 6, 9], "", {})
    traces = MultiTurn(env.step, max_turns=2, observation_role="user")(ctx, [prompt], n)
    return backend, env, traces


def test_a_turn_2_starts_while_another_sample_waits_on_its_turn_1():
    backend, env, traces = _run()
    assert env.saw_turn2 is True  # submitted while sample 0's turn 1 was still being answered
    assert backend.turns.index(2) < len(backend.turns) - 1  # sample 0's turn 2 came after it
    assert [t.meta["turns"] for t in traces] == [2, 2, 2]
    spans = [t.meta["turn_spans"] for t in traces]
    assert min(s[1][0] for s in spans[1:]) < spans[0][1][0]  # another's turn 2 before sample 0's


def test_the_episode_is_what_one_turn_after_another_builds():
    """Prompt (3 ids), turn 1 = [3, 1, 2], observation, turn 2 = [len(context), 1, 2]."""
    _, _, traces = _run()
    for t in traces:
        (call,) = t.calls
        turn1, obs = [3, 1, 2], list(OBSERVATION)
        turn2 = [3 + len(turn1) + len(obs), 1, 2]
        assert call.gen.response_ids == turn1 + obs + turn2
        assert call.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1]
        assert call.gen.logprobs == [-0.25] * 3 + [0.0] * 2 + [-0.25] * 3
        assert t.reward == 1.0


class Batches(Echo):
    """Echo that records how many requests each ``submit_many`` call carried."""

    def __init__(self):
        super().__init__()
        self.calls: list[int] = []

    def submit_many(self, requests, cfg):
        self.calls.append(len(requests))
        return super().submit_many(requests, cfg)


def test_turns_ready_at_one_wake_up_reach_the_engine_in_one_call():
    """Every episode's first turn goes in one call, and the later turns in at most one call per
    episode (those ready at one wake-up together): fewer calls than turns, every turn sent once."""
    backend = Batches()
    ctx = GenerateContext(backend, RolloutConfig(max_response_len=64, seed=1), Tokens(), None)
    answer = lambda c: Step(done=True) if len(c.turns) == 2 else Step("7 7")  # noqa: E731
    traces = MultiTurn(answer, max_turns=2)(ctx, [Prompt("p", [5, 6, 9], "", {})], 4)
    assert [t.meta["turns"] for t in traces] == [2] * 4
    assert backend.calls[0] == 4 and sum(backend.calls) == 8 and len(backend.calls) <= 5
    assert sorted(backend.turns) == [1] * 4 + [2] * 4
