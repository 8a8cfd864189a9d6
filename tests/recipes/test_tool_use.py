"""The multi-turn loop on the scripted engine with the arith-tool environment: each episode
submits its turns on its own, a sample that answers early submits no more, the observation is
the chat template's tool message, and the loss mask covers the model's turns."""

from __future__ import annotations

from dataset.arith_tool import arith_tool_rows, tool_call
from recipes.tool_use import ArithToolEnv
from trainer.rollout.multiturn.loop import MultiTurn
from trainer.rollout.multiturn.stats import episode_stats
from trainer.rollout.samples.data import Prompt

CALL = tool_call("2 * 3 + 4") + "<|im_end|>"
OBSERVATION = "\n<|im_start|>user\n<tool_response>\n10\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _prompt(ctx, text="<|im_start|>user\ncalc 2 * 3 + 4<|im_end|>\n<|im_start|>assistant\n"):
    return Prompt(text, ctx.encode(text), "10", {})


def _script(prompt: str, k: int) -> str:
    """In the first wave (k: the sample), sample 0 answers at once (wrong), sample 2 calls the
    tool badly, sample 1 well; later, a sample told of an error calls again, others answer."""
    turns = prompt.count("<tool_response>")
    if turns == 0:
        return ["\\boxed{11}<|im_end|>", CALL, '<tool_call>{"name": "calculator"<|im_end|>'][k]
    if turns == 1 and "Error" in prompt:
        return CALL
    return "\\boxed{10}<|im_end|>"


def test_episodes_submit_their_turns_and_are_masked(scripted):
    ctx, backend = scripted(_script)
    plugin = MultiTurn(ArithToolEnv().step, max_turns=4)
    traces = plugin(ctx, [_prompt(ctx)], 3)
    # turns submitted per turn index: 3 samples, then 2 (sample 0 finished at once), then 1
    per_turn = [text.count("<tool_response>") for text, _ in backend.requests]
    assert [per_turn.count(t) for t in range(3)] == [3, 2, 1]
    assert [t.reward for t in traces] == [0.0, 1.0, 1.0]
    assert [t.meta["turns"] for t in traces] == [1, 2, 3]
    assert [(t.meta["tool_calls"], t.meta["tool_errors"]) for t in traces] == [(0, 0), (1, 0), (2, 1)]
    (call,) = traces[1].calls
    turn1, obs, turn2 = ctx.encode(CALL), ctx.encode(OBSERVATION), ctx.encode("\\boxed{10}<|im_end|>")
    assert call.gen.response_ids == turn1 + obs + turn2
    assert call.loss_mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert call.gen.logprobs == [-0.5] * len(turn1) + [0.0] * len(obs) + [-0.5] * len(turn2)
    # the second turn was sent the whole context: prompt, call, observation
    assert ctx.decode(_prompt(ctx).input_ids + turn1 + obs) in [t for t, _ in backend.requests]
    assert traces[1].text == "\\boxed{10}<|im_end|>"


def test_turn_limit_and_budget_end_episodes(scripted):
    ctx, backend = scripted(lambda p, k: CALL)  # calls the tool forever
    traces = MultiTurn(ArithToolEnv().step, max_turns=2)(ctx, [_prompt(ctx)], 2)
    assert [t.meta["turns"] for t in traces] == [2, 2] and [t.reward for t in traces] == [None, None]
    assert traces[0].calls[0].loss_mask.count(0) == len(ctx.encode(OBSERVATION))
    ctx, _ = scripted(lambda p, k: CALL, max_response_len=len(ctx.encode(CALL)) + 10)
    (short,) = MultiTurn(ArithToolEnv().step, max_turns=4)(ctx, [_prompt(ctx)], 1)
    assert short.meta["turns"] == 1 and short.calls[0].gen.finish_reason == "length"


def test_metrics(scripted):
    ctx, _ = scripted(_script)
    traces = MultiTurn(ArithToolEnv().step, max_turns=4)(ctx, [_prompt(ctx)], 3)
    m = episode_stats(traces)
    assert m["rollout/turns_per_sample"] == 2.0 and m["rollout/tool_calls_per_sample"] == 1.0
    assert m["rollout/tool_error_fraction"] == 1 / 3
    error = OBSERVATION.replace("10", "Error: the tool call is not closed with </tool_call>")
    obs = 2 * len(ctx.encode(OBSERVATION)) + len(ctx.encode(error))
    assert m["rollout/observation_tokens_per_sample"] == obs / 3
    model = sum(len(ctx.encode(text)) for text in ("\\boxed{11}<|im_end|>", CALL, CALL,
                "\\boxed{10}<|im_end|>", "\\boxed{10}<|im_end|>",
                '<tool_call>{"name": "calculator"<|im_end|>'))
    prompts = 3 * len(_prompt(ctx).input_ids)
    assert m["rollout/model_token_share"] == model / (model + obs + prompts)


def test_the_task_rows_demonstrate_the_format():
    row = arith_tool_rows(1, seed=0, style="tiny")[0]
    a, b, c = (int(x) for x in row["prompt"].split("calc ")[1].split("<")[0].replace("*", "+").split("+"))
    assert row["label"] == str(a * b + c)
    assert row["solution_turns"][1] == f"\\boxed{{{a * b + c}}}"


def test_warm_up_examples_are_the_rollouts_tokens(scripted):
    """A worked example (trainer.warmup) is token for token the episode a model that writes the
    solution's turns samples, with the same mask: the warm-up teaches what the rollout trains."""
    from trainer.warmup import example_ids

    ctx, _ = scripted(lambda p, k: "")
    row = arith_tool_rows(1, seed=3, style="tiny")[0]
    turns = iter(row["solution_turns"])
    ctx.backend.script = lambda p, k: next(turns) + "<|im_end|>"
    (trace,) = MultiTurn(ArithToolEnv().step)(ctx, [Prompt(row["prompt"], ctx.encode(row["prompt"]),
                                                            row["label"], {})], 1)
    prompt, answer, mask = example_ids(ctx.tokenizer, row)
    assert trace.reward == 1.0 and prompt == trace.calls[0].prompt_ids
    assert answer == trace.calls[0].gen.response_ids and mask == trace.calls[0].loss_mask
