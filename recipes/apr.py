"""Adaptive Parallel Reasoning subcalls (APR, arXiv 2504.15466) as a generate plug-in.

    --custom-generate-function-path recipes.apr:APRSubcalls
    --custom-generate-args budget=10 child_tokens=256 max_spawns=4

A parent thread may open a spawn block; its generation stops when the block closes:

    <spawn>
    <child>Try 46 - 23 = 23, then reach 51 from [23, 28].</child>
    <child>Try 46 + 28 = 74, then reach 51 from [23, 74].</child>
    </spawn>

Each child is decoded as an independent request from its own text (all children of all parents
of a wave batched through the same engine); a child returns what it writes inside its last
``<result>...</result>`` (else "No Solution"). The results are joined into the parent's context

    <joined>
    <result>...</result>
    <result>...</result>
    </joined>

and the parent resumes. The parent's prompt starts with the subcall budget condition
("Sub Call Budget: 10 "); children do not get it. A trace is the parent's calls and all its
children's: the run's reward reads the parent's text, every call gets the trace's advantage,
and each call's loss is divided by the number of calls of its trace. Requests that would not fit
the context are shortened and flagged (``rollout/requests_truncated``), never rejected. Children
beyond the budget are not run; they return "No Solution (subcall budget exhausted)".
The spawn syntax is ours (APR's own traces use "Calling Sub Searches" blocks); the markers are
options of the class.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from dataset.countdown_r1 import SYSTEM, make_rows
from dataset.formats import write_rows

from trainer.rollout.samples.generate import GenerateContext, Request
from trainer.rollout.samples.traces import Call, Trace

NO_SOLUTION = "No Solution"
BUDGET_EXHAUSTED = "No Solution (subcall budget exhausted)"


@dataclasses.dataclass
class Thread:
    """One parent thread while it runs: its context grows by each segment and each join."""

    prompt: int
    context: list[int]
    calls: list[Call] = dataclasses.field(default_factory=list)
    text: str = ""  # the parent's side of the trace: segments and joins
    generated: int = 0  # parent tokens so far (the response budget counts them all)
    children_run: int = 0
    done: bool = False


class APRSubcalls:
    def __init__(self, budget: int = 10, condition: bool = True,
                 condition_prefix: str = "Sub Call Budget: {budget} ", child_tokens: int | None = None,
                 max_spawns: int = 4, spawn_open: str = "<spawn>", spawn_close: str = "</spawn>",
                 child_open: str = "<child>", child_close: str = "</child>",
                 result_open: str = "<result>", result_close: str = "</result>",
                 join_open: str = "\n<joined>\n", join_close: str = "</joined>\n",
                 context_length: int | None = None):
        if budget < 0 or max_spawns < 0:
            raise ValueError("budget and max_spawns must be >= 0")
        self.budget, self.max_spawns, self.child_tokens = budget, max_spawns, child_tokens
        self.prefix = condition_prefix.format(budget=budget) if condition else ""
        self.spawn_open, self.spawn_close = spawn_open, spawn_close
        self.child_re = _between(child_open, child_close)
        self.result_re = _between(result_open, result_close)
        self.result_open, self.result_close = result_open, result_close
        self.join_open, self.join_close = join_open, join_close
        self.context_length = context_length  # read by the trainer: requests are fitted to it

    def __call__(self, ctx: GenerateContext, prompts, n: int) -> list[Trace]:
        prefix = ctx.encode(self.prefix) if self.prefix else []
        threads = [Thread(i, prefix + list(p.input_ids)) for i, p in enumerate(prompts)
                   for _ in range(n)]
        for spawn in range(self.max_spawns + 1):
            active = [t for t in threads if not t.done]
            if not active:
                break
            self._parent_wave(ctx, active, may_spawn=spawn < self.max_spawns)
            self._child_wave(ctx, [t for t in active if not t.done])
        return [self._trace(t) for t in threads]

    # --- waves -------------------------------------------------------------------------------
    def _parent_wave(self, ctx, threads: list[Thread], may_spawn: bool) -> None:
        stop = (self.spawn_close,) if may_spawn else ()
        limit = ctx.cfg.max_response_len
        gens = ctx.generate([Request(t.context, max(1, limit - t.generated), stop)
                             for t in threads])
        for t, g in zip(threads, gens):
            t.calls.append(ctx.call(g, role="parent"))
            t.context = t.context + g.response_ids
            t.text += g.text
            t.generated += len(g.response_ids)
            spawned = may_spawn and g.finish_reason == "stop" and self.children(g.text) is not None
            t.done = not spawned or t.generated >= limit

    def _child_wave(self, ctx, threads: list[Thread]) -> None:
        """Every child of every spawning parent in one wave; then each parent's join."""
        plans = [self._plan(t) for t in threads]
        reqs = [Request(ctx.encode(c), self.child_tokens or ctx.cfg.max_response_len)
                for run, _ in plans for c in run]
        gens = iter(ctx.generate(reqs) if reqs else [])
        for t, (run, skipped) in zip(threads, plans):
            results = []
            for _ in run:
                g = next(gens)
                t.calls.append(ctx.call(g, role="child"))
                results.append(self.result_of(g.text))
            self._join(ctx, t, results + [BUDGET_EXHAUSTED] * skipped)

    def _plan(self, t: Thread) -> tuple[list[str], int]:
        """The children this spawn runs (within the budget) and how many it skips."""
        children = self.children(t.text) or []
        room = max(0, self.budget - t.children_run)
        t.children_run += min(room, len(children))
        return children[:room], max(0, len(children) - room)

    def _join(self, ctx, t: Thread, results: list[str]) -> None:
        body = "".join(f"{self.result_open}{r}{self.result_close}\n" for r in results)
        join = f"{self.join_open}{body}{self.join_close}"
        t.context = t.context + ctx.encode(join)
        t.text += join

    def _trace(self, t: Thread) -> Trace:
        weight = 1.0 / len(t.calls)  # every trace weighs the same, however many calls it made
        for c in t.calls:
            c.loss_weight = weight
        return Trace(t.calls, t.text, t.prompt,
                     meta={"children": t.children_run, "calls": len(t.calls)})

    # --- parsing (pure; tested on hand-written traces) ---------------------------------------
    def children(self, text: str) -> list[str] | None:
        """The children of the spawn block that ``text`` ends with (None: it does not end with
        a complete one)."""
        end = text.rstrip()
        if not end.endswith(self.spawn_close):
            return None
        start = end.rfind(self.spawn_open)
        if start < 0:
            return None
        block = end[start + len(self.spawn_open): len(end) - len(self.spawn_close)]
        return [c.strip() for c in self.child_re.findall(block) if c.strip()]

    def result_of(self, text: str) -> str:
        found = self.result_re.findall(text)
        return found[-1].strip() if found and found[-1].strip() else NO_SOLUTION


def _between(open_tag: str, close_tag: str) -> re.Pattern:
    return re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.DOTALL)


# --- data: Countdown tasks with the spawn instructions ----------------------------------------
QUESTION = ("Using the numbers {numbers}, create an equation that equals {target}. You can use "
            "basic arithmetic operations (+, -, *, /) and each number can only be used once. You "
            "may split the search: write <spawn>, then one <child>...</child> per sub-search "
            "(each child states the numbers it has left and the target it must reach), then "
            "</spawn>; each child answers inside <result> </result> tags and the results come "
            "back to you in a <joined> block. Show your work in <think> </think> tags. And return "
            "the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")


def prompt_rows(split: str, n: int, seed: int) -> list[dict]:
    """Countdown-3to4 tasks (``dataset.countdown_r1``'s split and labels) with the APR prompt."""
    rows = make_rows(split, n, seed, chat=False)
    for r in rows:
        label = json.loads(r["label"])
        question = QUESTION.format(numbers=label["numbers"], target=label["target"])
        r["prompt"] = f"{SYSTEM}\nUser: {question}\nAssistant: Let me solve this step by step.\n<think>"
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipes.apr",
                                description="Countdown tasks with APR's spawn instructions")
    p.add_argument("--split", choices=["train", "test"], required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    count = write_rows(args.out, prompt_rows(args.split, args.n, args.seed))
    print(f"wrote {count} APR countdown {args.split} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
