"""APR subcalls: spawn-block parsing on hand-written (and malformed) traces, the waves a parent
with children makes on a scripted engine (contexts, joins, budget, truncation, loss weights,
the shared advantage), the reward on the parent's text, and 2 rollouts through
scripts/run-apr.sh -> torchrun -> trainer.train with the plug-in."""

from __future__ import annotations

import json

import pytest
import torch

from recipes.apr import BUDGET_EXHAUSTED, NO_SOLUTION, APRSubcalls, prompt_rows
from recipes.countdown import reward, reward_binary
from trainer.algorithms import AdvantageConfig
from trainer.learner.grpo_update import RolloutBatch, step_bounds, trace_advantages
from trainer.learner.packing import Sample
from trainer.rollout.samples.data import Prompt
from trainer.rollout.samples.rewards import RewardInput

SPAWN = "think <spawn>\n<child>left 8 2 to 16</child>\n<child>left 15 2 to 16</child>\n</spawn>"


@pytest.mark.parametrize("text,children", [
    (SPAWN, ["left 8 2 to 16", "left 15 2 to 16"]),
    (SPAWN + "\n", ["left 8 2 to 16", "left 15 2 to 16"]),              # trailing space is fine
    ("<spawn><child>a</child><child> </child><child>b</child></spawn>", ["a", "b"]),  # empty child dropped
    ("<spawn><child>a</child></spawn> and more", None),                 # block not at the end
    ("<spawn><child>a</child>", None),                                  # unbalanced: never closed
    ("<child>a</child></spawn>", None),                                 # close without open
    ("<spawn></spawn>", []),                                            # a spawn of nothing
    ("<spawn><child>a</spawn>", []),                                    # unclosed child: no child
    ("", None),
])
def test_spawn_block_parsing(text, children):
    assert APRSubcalls().children(text) == children


@pytest.mark.parametrize("text,result", [
    ("x <result>3+5=8</result>", "3+5=8"),
    ("<result>a</result> then <result>b</result>", "b"),                # the last result counts
    ("<result>  </result>", NO_SOLUTION),
    ("<result>unclosed", NO_SOLUTION),
    ("nothing here", NO_SOLUTION),
])
def test_child_result(text, result):
    assert APRSubcalls().result_of(text) == result


def _script(prompt: str, k: int) -> str:
    if prompt.startswith("left 8 2"):
        return "8*2=16 <result>8*2=16</result>"
    if prompt.startswith("left 15 2"):
        return "15+2=17, no"
    if "<joined>" in prompt:
        return "<answer>(3 + 5) * 2</answer>"
    return SPAWN + " never seen"  # text after the stop string is cut by the engine


def _prompt(ctx) -> Prompt:
    ids = ctx.encode("Q: 3 5 2 -> 16\n")
    return Prompt("Q: 3 5 2 -> 16\n", ids, json.dumps({"target": 16, "numbers": [3, 5, 2]}), {})


def test_a_parent_with_two_children(scripted):
    ctx, backend = scripted(_script)
    plugin = APRSubcalls(budget=10)
    [trace] = plugin(ctx, [_prompt(ctx)], 1)
    roles = [c.role for c in trace.calls]
    assert roles == ["parent", "child", "child", "parent"]
    assert [c.loss_weight for c in trace.calls] == [0.25] * 4
    first, second = trace.calls[0], trace.calls[3]
    # the parent is conditioned on its budget; the children are not
    assert ctx.decode(first.prompt_ids) == "Sub Call Budget: 10 Q: 3 5 2 -> 16\n"
    assert ctx.decode(trace.calls[1].prompt_ids) == "left 8 2 to 16"
    join = "\n<joined>\n<result>8*2=16</result>\n<result>No Solution</result>\n</joined>\n"
    # the resumed parent's context is exactly: first context + its tokens + the join's tokens
    assert second.prompt_ids == first.prompt_ids + first.gen.response_ids + ctx.encode(join)
    assert trace.text == SPAWN + join + "<answer>(3 + 5) * 2</answer>"
    assert reward(RewardInput("p", trace.text, _prompt(ctx).label)) == 1.0
    stops = [params.get("stop") for _, params in backend.requests]
    assert stops == [["</spawn>"], None, None, ["</spawn>"]]  # children cannot spawn


def test_budget_caps_children(scripted):
    ctx, _ = scripted(_script)
    [trace] = APRSubcalls(budget=1)(ctx, [_prompt(ctx)], 1)
    assert [c.role for c in trace.calls] == ["parent", "child", "parent"]
    assert f"<result>{BUDGET_EXHAUSTED}</result>" in trace.text
    assert trace.meta == {"children": 1, "calls": 3}
    assert ctx.decode(trace.calls[0].prompt_ids).startswith("Sub Call Budget: 1 ")


def test_spawns_stop_at_max_spawns(scripted):
    ctx, backend = scripted(lambda p, k: SPAWN if not p.startswith("left") else "<result>r</result>")
    [trace] = APRSubcalls(max_spawns=2)(ctx, [_prompt(ctx)], 1)
    # parent, 2 children, parent, 2 children, parent (which may no longer spawn)
    assert [c.role for c in trace.calls] == ["parent", "child", "child"] * 2 + ["parent"]
    assert backend.requests[-1][1].get("stop") is None


def test_over_length_children_are_truncated_not_rejected(scripted):
    long_child = "left 8 2 " + "very long context " * 20  # ~270 tokens of the tiny tokenizer
    spawn = f"<spawn><child>{long_child}</child></spawn>"
    ctx, backend = scripted(lambda p, k: spawn if p.startswith("Sub") else "<result>ok</result>",
                            max_response_len=512, context_length=400)
    [trace] = APRSubcalls(child_tokens=200, max_spawns=1)(ctx, [_prompt(ctx)], 1)
    assert [c.role for c in trace.calls] == ["parent", "child", "parent"]
    child = trace.calls[1]
    assert child.gen.meta["truncated"] is True and ctx.truncated >= 1
    # what was trained is what was sent: the shortened prompt, within the context
    sent_prompt, params = backend.requests[1]
    assert ctx.decode(child.prompt_ids) == sent_prompt
    assert len(child.prompt_ids) + params["max_new_tokens"] < 400 and params["max_new_tokens"] < 200


def test_calls_share_their_trace_advantage_and_weigh_one_trace():
    # two traces of one prompt: trace 0 (reward 1) has 3 calls, trace 1 (reward 0) has 1
    samples = [Sample([1], [2, 3]) for _ in range(4)]
    batch = RolloutBatch(samples, torch.tensor([1.0, 0.0]), [torch.zeros(2)] * 4,
                         group_index=["p", "p"], trace_index=[0, 0, 0, 1],
                         loss_weights=[1 / 3, 1 / 3, 1 / 3, 1.0])
    mask = torch.ones(4, 2, dtype=torch.bool)
    adv = trace_advantages(batch, AdvantageConfig("grpo"), mask)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)  # GRPO of [1, 0]: (r - 0.5) / unbiased std (0.7071)
    assert torch.allclose(adv, torch.tensor([[a, a]] * 3 + [[-a, -a]]), atol=1e-5)
    assert step_bounds(batch, 1) == [(0, 3), (3, 4)]  # a trace is never split over steps
    assert step_bounds(batch, 2) == [(0, 4)]


def test_prompt_rows_are_countdown_tasks_with_the_spawn_instructions():
    rows = prompt_rows("train", 20, seed=0)
    assert len(rows) == 20 and all("<spawn>" in r["prompt"] and "<answer>" in r["prompt"] for r in rows)
    for r in rows:
        label = json.loads(r["label"])
        assert reward(RewardInput("p", f"<answer>{r['solution']}</answer>", r["label"])) == 1.0
        assert 3 <= len(label["numbers"]) <= 4


@pytest.mark.launch
def test_run_apr_through_torchrun(run_recipe, tmp_path):
    flags = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
             "--rollout-max-response-len", "12", "--eval-max-response-len", "8",
             "--eval-prompt-data", "countdown", str(tmp_path / "data" / "apr" / "test.jsonl@[0:2]"),
             "--custom-generate-args", "budget=2", "child_tokens=6", "max_spawns=1",
             "--max-tokens-per-gpu", "4096", "--sglang-max-total-tokens", "8192", "--lr", "1e-3",
             "--save-debug-rollout-data", str(tmp_path / "rollout{rollout_id}.jsonl")]
    metrics = run_recipe("run-apr.sh", flags, DATA_DIR=str(tmp_path / "data"))
    assert [m["step"] for m in metrics] == [1, 2] and "eval/countdown/score" in metrics[1]
    assert all(m["rollout/traces"] == 4 for m in metrics)
    rows = [json.loads(x) for x in (tmp_path / "rollout0.jsonl").read_text().splitlines()]
    assert {r["trace"] for r in rows} == {0, 1, 2, 3}
    for r in rows:  # the reward read the trace's parent text (a random model does not spawn)
        parents = [x for x in rows if x["trace"] == r["trace"]]
        if all(x["role"] == "parent" for x in parents) and len(parents) == 1:
            assert r["reward"] == reward_binary(RewardInput("p", r["response"], r["label"]))
        assert r["loss_weight"] == 1 / len(parents)
