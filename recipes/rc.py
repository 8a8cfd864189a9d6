"""Reasoning Cache (RC, arXiv 2602.03773) as a generate plug-in of the trainer.

    --custom-generate-function-path recipes.rc:ReasoningCache
    --custom-generate-args rounds=2 thinking_tokens=512 summary_tokens=128 summaries_per_round=2 \
        thinking_kl_coef=0.001 summary_kl_coef=0.0 replay_buffer=true

Decoding alternates reasoning (up to H_R = ``thinking_tokens``) and summarising (up to H_S =
``summary_tokens``); each round sees only the problem and the latest summary, never the earlier
reasoning, so the context a request needs is bounded by the problem + H_S + H_R whatever the
number of rounds (an alternative to KV compression; both can be on at once).

Training (per prompt, K = ``--n-samples-per-prompt``):
- round 0: K reasoning samples from the problem (or from a replayed summary);
- between rounds: the chain's latest reasoning (its first sample) is summarised
  ``summaries_per_round`` times; each summary starts a branch of K reasoning samples;
- every reasoning sample is trained with its own myopic reward (the run's reward on that round's
  answer), compared with the K samples of its branch (its GRPO group);
- every summary is trained with the mean reward of its branch, compared with the other
  summaries of the same round (so a lone summary per round has no advantage);
- thinking and summary tokens take separate KL coefficients (``thinking_kl_coef``,
  ``summary_kl_coef``; unset = ``--kl-loss-coef``);
- ``replay_buffer``: the last round's summaries are kept per problem (``buffer_size`` each, the
  newest replace the old: purge-on-add) and a later epoch starts a chain from one of them with
  probability ``replay_prob``. The buffer lives with each engine's host and is not checkpointed.
Eval (``ctx.mode == "eval"``): one summary per round and the last round's reasoning is the answer.
"""

from __future__ import annotations

import collections
import dataclasses
import random

from trainer.rollout.samples.generate import GenerateContext, Request
from trainer.rollout.samples.traces import Trace

CONTINUE = ("{problem}\n\nHere is a summary of your earlier work on this problem:\n{summary}\n\n"
            "Continue from this summary and finish the solution.")
SUMMARISE = ("{problem}\n\n{earlier}Here is your latest reasoning on it:\n{reasoning}\n\n"
             "Summarise the progress so far in at most {budget} tokens: the approach, every "
             "intermediate result still needed, and what remains to be done. Do not go on solving.")
EARLIER = "Summary of the work before it:\n{summary}\n\n"


@dataclasses.dataclass
class Branch:
    """K reasoning samples of one prompt conditioned on one summary (None: the problem alone)."""

    prompt: int
    summary: str | None
    summary_trace: Trace | None = None  # rewarded with this branch's mean once it is scored


class ReasoningCache:
    def __init__(self, rounds: int = 2, thinking_tokens: int | None = None,
                 summary_tokens: int = 128, summaries_per_round: int = 1,
                 thinking_kl_coef: float | None = None, summary_kl_coef: float | None = None,
                 replay_buffer: bool = False, buffer_size: int = 2, replay_prob: float = 0.5):
        if rounds < 1 or summary_tokens < 1 or summaries_per_round < 1 or buffer_size < 1:
            raise ValueError("rounds, summary_tokens, summaries_per_round and buffer_size must be >= 1")
        self.rounds, self.thinking_tokens, self.summary_tokens = rounds, thinking_tokens, summary_tokens
        self.summaries_per_round = summaries_per_round
        self.thinking_kl_coef, self.summary_kl_coef = thinking_kl_coef, summary_kl_coef
        self.replay, self.replay_prob = replay_buffer, replay_prob
        self.buffer: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=buffer_size))
        # the reference model must exist when a coefficient is set (even with --kl-loss-coef 0)
        self.needs_reference = bool(thinking_kl_coef or summary_kl_coef)

    def __call__(self, ctx: GenerateContext, prompts, n: int) -> list[Trace]:
        branches = [Branch(i, self._replayed(ctx, p, i)) for i, p in enumerate(prompts)]
        traces: list[Trace] = []
        for r in range(self.rounds):
            last = r == self.rounds - 1
            traces += self._reason(ctx, prompts, branches, n, r, last)
            if last:
                break
            branches = self._summarise(ctx, prompts, branches, traces, n, r)
            traces += [b.summary_trace for b in branches]
        if self.replay and ctx.mode == "train":
            self._remember(prompts, branches)
        return traces

    # --- the two kinds of request ----------------------------------------------------------
    def _reason(self, ctx, prompts, branches, n, r, last) -> list[Trace]:
        ids = [self._reason_ids(ctx, prompts[b.prompt], b.summary) for b in branches]
        budget = self.thinking_tokens or ctx.cfg.max_response_len
        gens = ctx.generate([Request(ids[k], budget) for k in range(len(branches)) for _ in range(n)])
        owners = [prompts[b.prompt] for b in branches for _ in range(n)]
        rewards = ctx.score(owners, [g.text for g in gens])
        traces = [Trace([ctx.call(g, kl_coef=self.thinking_kl_coef, role="reasoning")],
                        g.text, branches[k // n].prompt, group=("reasoning", r, k // n),
                        reward=rw, final=last, meta={"round": r})
                  for k, (g, rw) in enumerate(zip(gens, rewards))]
        for k, b in enumerate(branches):  # a summary is worth what its branch scored
            if b.summary_trace is not None:
                b.summary_trace.reward = sum(rewards[k * n:(k + 1) * n]) / n
        return traces

    def _summarise(self, ctx, prompts, branches, traces, n, r) -> list[Branch]:
        """Summaries of each prompt's chain (its first branch's first sample) -> new branches."""
        m = 1 if ctx.mode == "eval" else self.summaries_per_round
        chains = {}
        for k, b in enumerate(branches):
            chains.setdefault(b.prompt, (b, traces[-len(branches) * n + k * n]))
        reqs, owners = [], []
        for i, (b, first) in chains.items():
            ids = ctx.chat(self._summary_text(ctx, prompts[i], b.summary, first.calls[0].gen))
            reqs += [Request(ids, self.summary_tokens)] * m
            owners += [i] * m
        gens = ctx.generate(reqs)
        return [Branch(i, _plain(ctx, g), Trace(
                    [ctx.call(g, kl_coef=self.summary_kl_coef, role="summary")], g.text, i,
                    group=("summary", r, i), final=False, meta={"round": r}))
                for i, g in zip(owners, gens)]

    # --- prompts -----------------------------------------------------------------------------
    def _reason_ids(self, ctx, prompt, summary: str | None) -> list[int]:
        if summary is None:
            return list(prompt.input_ids)  # round 0: the task's own prompt, format untouched
        return ctx.chat(CONTINUE.format(problem=problem_text(prompt), summary=summary))

    def _summary_text(self, ctx, prompt, summary: str | None, gen) -> str:
        earlier = EARLIER.format(summary=summary) if summary else ""
        return SUMMARISE.format(problem=problem_text(prompt), earlier=earlier,
                                reasoning=_plain(ctx, gen), budget=self.summary_tokens)

    # --- replay buffer -----------------------------------------------------------------------
    def _replayed(self, ctx, prompt, i: int) -> str | None:
        stored = self.buffer.get(prompt.text)
        if not (self.replay and ctx.mode == "train" and stored):
            return None
        rng = random.Random(f"{ctx.cfg.seed}:{i}")  # seeded: a resumed run replays the same
        return rng.choice(list(stored)) if rng.random() < self.replay_prob else None

    def _remember(self, prompts, branches) -> None:
        fresh = collections.defaultdict(list)
        for b in branches:
            if b.summary is not None:
                fresh[prompts[b.prompt].text].append(b.summary)
        for key, summaries in fresh.items():  # purge-on-add: the newest summaries replace
            self.buffer[key].clear()
            self.buffer[key].extend(summaries)


def problem_text(prompt) -> str:
    """The problem as the user wrote it: the row's string, or its last user message."""
    src = prompt.source
    if isinstance(src, list):
        users = [m["content"] for m in src if m.get("role") == "user"]
        return users[-1] if users else prompt.text
    return src if isinstance(src, str) else prompt.text


def _plain(ctx, gen) -> str:
    """A generation's text without special tokens (EOS), to quote inside another prompt."""
    return ctx.tokenizer.decode(gen.response_ids, skip_special_tokens=True).strip()
