"""Reasoning Cache: the rounds a prompt makes on a scripted engine (what each request is
conditioned on, myopic rewards, groups, summary rewards, KL coefficients, the replay buffer,
eval), the per-row KL coefficients in the loss, and 2 rollouts through scripts/run-rc.sh ->
torchrun -> trainer.train, dense and with R-KV compression on at once."""

from __future__ import annotations

import json

import pytest
import torch

from recipes.rc import ReasoningCache
from trainer.algorithms import PolicyLossConfig, policy_loss
from trainer.rollout.samples.data import Prompt

PROBLEM = "What is 2 + 3?"


def _script(prompt: str, k: int) -> str:
    """Round 0 reasons without an answer; summary k says "S<k>"; from S0 the answer is right,
    from S1 wrong; what a reasoning request sees is echoed so the test can check it."""
    if "Summarise the progress" in prompt:
        return f"S{k}: tried adding"
    if "S0: tried adding" in prompt:
        return "so \\boxed{5}"
    if "S1: tried adding" in prompt:
        return "so \\boxed{6}"
    return f"thinking {k} about it"


def _prompt(ctx) -> Prompt:
    text = ctx.tokenizer.apply_chat_template([{"role": "user", "content": PROBLEM}], tokenize=False,
                                             add_generation_prompt=True)
    return Prompt(text, ctx.encode(text), "5", {}, [{"role": "user", "content": PROBLEM}])


def test_two_rounds_two_summaries(scripted):
    ctx, backend = scripted(_script)
    rc = ReasoningCache(rounds=2, summaries_per_round=2, thinking_tokens=40, summary_tokens=20,
                        thinking_kl_coef=0.01, summary_kl_coef=0.0)
    traces = rc(ctx, [_prompt(ctx)], 2)
    roles = [t.calls[0].role for t in traces]
    assert roles == ["reasoning"] * 2 + ["summary"] * 2 + ["reasoning"] * 4
    assert [t.reward for t in traces] == [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]  # myopic
    assert [t.final for t in traces] == [False] * 4 + [True] * 4
    groups = [t.group for t in traces]
    assert groups[0] == groups[1] and groups[2] == groups[3]          # summaries compete
    assert groups[4] == groups[5] != groups[6] == groups[7]           # one group per branch
    assert [t.calls[0].kl_coef for t in traces] == [0.01] * 2 + [0.0] * 2 + [0.01] * 4
    assert rc.needs_reference
    # budgets: thinking 40, summaries 20
    assert [p["max_new_tokens"] for _, p in backend.requests] == [40, 40, 20, 20, 40, 40, 40, 40]
    # the summary saw the first sample's reasoning; round 1 sees the problem and the summary only
    summary_prompt = backend.requests[2][0]
    assert PROBLEM in summary_prompt and "thinking 0 about it" in summary_prompt
    round1 = backend.requests[4][0]
    assert PROBLEM in round1 and "S0: tried adding" in round1 and "thinking" not in round1
    assert ctx.decode(traces[4].calls[0].prompt_ids) == round1


def test_replay_buffer_starts_a_later_epoch_from_a_stored_summary(scripted):
    ctx, backend = scripted(_script)
    rc = ReasoningCache(rounds=2, summaries_per_round=2, replay_buffer=True, replay_prob=1.0,
                        buffer_size=2)
    prompt = _prompt(ctx)
    rc(ctx, [prompt], 2)
    assert list(rc.buffer[prompt.text]) == ["S0: tried adding", "S1: tried adding"]
    backend.requests.clear()
    traces = rc(ctx, [prompt], 2)
    first = backend.requests[0][0]  # round 0 of the second epoch continues a stored summary
    assert "Here is a summary of your earlier work" in first and "tried adding" in first
    assert traces[0].reward in (0.0, 1.0)
    assert len(rc.buffer[prompt.text]) == 2  # purge-on-add: replaced, not grown


def test_eval_makes_one_summary_per_round_and_answers_with_the_last(scripted):
    ctx, _ = scripted(_script, mode="eval")
    traces = ReasoningCache(rounds=3, summaries_per_round=4)(ctx, [_prompt(ctx)], 1)
    assert [t.calls[0].role for t in traces] == ["reasoning", "summary"] * 2 + ["reasoning"]
    assert [t.final for t in traces] == [False] * 4 + [True]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        ReasoningCache(rounds=0)


def test_per_row_kl_coefficients_weight_the_kl_term():
    # two rows; KL only on row 0 (coef 0.5): loss = pg + 0.5 * kl_row0 / 2 rows (seq-mean)
    logp = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    ref = torch.tensor([[-1.2, -1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.zeros(2, 2)
    cfg = PolicyLossConfig(kl_loss_coef=0.0, kl_loss_type="k1")
    loss, m = policy_loss(logp, logp, adv, mask, cfg, ref_logp=ref, kl_coefs=torch.tensor([0.5, 0.0]))
    k1_row0 = ((-1.0 + 1.2) + (-2.0 + 1.0)) / 2
    assert loss.item() == pytest.approx(0.5 * k1_row0 / 2, abs=1e-6)
    # row weights: seq-mean over weighted rows (row 0 counts 1/3)
    w = torch.tensor([1 / 3, 1.0])
    _, m = policy_loss(logp, logp, adv, mask, cfg, ref_logp=ref, row_weights=w)
    k1_row1 = ((-1.5 + 1.0) + (-0.5 + 1.0)) / 2
    assert m["kl_loss"].item() == pytest.approx((k1_row0 / 3 + k1_row1) / (4 / 3), abs=1e-6)


@pytest.mark.launch
@pytest.mark.parametrize("compress", [pytest.param("", marks=pytest.mark.slow), "rkv"])  # CI: R-KV
def test_run_rc_through_torchrun(run_recipe, tmp_path, compress):
    data = tmp_path / "data" / "simplelr_qwen_level3to5" / "train.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {a}?", "label": str(2 * a)}) + "\n"
                            for a in range(1, 9)))
    flags = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
             "--custom-generate-args", "rounds=2", "thinking_tokens=10", "summary_tokens=6",
             "summaries_per_round=2", "thinking_kl_coef=0.001", "summary_kl_coef=0.01",
             "replay_buffer=true", "--rm-type", "arithmetic",
             "--eval-prompt-data", "sums", f"{data}@[0:2]", "--eval-max-response-len", "8",
             "--eval-interval", "2", "--rollout-max-response-len", "10",
             "--max-tokens-per-gpu", "4096", "--sglang-max-total-tokens", "8192", "--lr", "1e-3",
             "--save-debug-rollout-data", str(tmp_path / "rollout{rollout_id}.jsonl")]
    if compress:  # a budget the rounds overrun, so eviction really happens: the script keeps
        # the prompt (KEEP_PROMPT=1), so B + N = 5 + 2 counts response tokens of the 10 drawn
        flags += ["--sglang-compress-max-prompt", "5", "--sglang-compress-max-window", "4",
                  "--sglang-compress-divide-length", "2"]
    metrics = run_recipe("run-rc.sh", flags, DATA_DIR=str(tmp_path / "data"), EVAL_SETS="",
                         COMPRESS=compress)
    assert [m["step"] for m in metrics] == [1, 2] and "eval/sums/score" in metrics[1]
    # per prompt: 2 reasoning + 2 summaries + 2 x 2 reasoning = 8 traces of one call each
    assert all(m["rollout/traces"] == 16 and m["rollout/calls_per_trace"] == 1 for m in metrics)
    if compress:
        assert all(m["kv_compressions_per_sample"] > 0 for m in metrics), metrics
    rows = [json.loads(x) for x in (tmp_path / "rollout1.jsonl").read_text().splitlines()]
    # waves over both prompts: round 0, the summaries, round 1 (the answers)
    assert [r["role"] for r in rows] == ["reasoning"] * 4 + ["summary"] * 4 + ["reasoning"] * 8
    assert [r["final"] for r in rows] == [False] * 8 + [True] * 8
