"""An environment for the multi-turn runs of the tests (a random tiny model writes the turns):
a numbered observation after each of the first two turns, then done."""

from trainer.rollout.multiturn.environment import Step


def echo(conversation) -> Step:
    k = len(conversation.turns)
    if k == 3:
        return Step(done=True, reward=float(conversation.sample_index % 2))
    return Step(f"result {k} of sample {conversation.sample_index}", tool_calls=1)
