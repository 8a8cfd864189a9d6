"""trainer.rollout.samples.rewards: built-in reward types against hand-checked answers, custom reward loading
(sync/async, per-item/batched), the grader timeout, and the flags."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import textwrap
import time
import uuid

import pytest

from trainer.rollout.samples.rewards import (RewardConfig, RewardInput, RewardModel, add_reward_args,
                                    reward_config_from_args)


def _inp(response, label, **metadata):
    return RewardInput(prompt="q", response=response, label=label, metadata=metadata)


@pytest.fixture(scope="module")
def math_model():
    with RewardModel(RewardConfig(rm_type="math", workers=2)) as model:
        yield model


# --------------------------------------------------------------------------- math

def test_math_grades_last_box(math_model):
    batch = [
        _inp("so x = 1/2, i.e. \\boxed{\\frac{1}{2}}.", "0.5"),          # equivalent forms
        _inp("\\boxed{3}", "4"),                                          # wrong
        _inp("the answer is 5", "5"),                                     # no box: 0 (slime's math)
        _inp("first \\boxed{5} then finally \\boxed{6}", "5"),             # the LAST box counts
        _inp("\\boxed{5} ... final \\boxed{5", "5"),                       # truncated final box
        _inp("\\boxed{}", "5"),                                           # empty box
        _inp("\\boxed{7}", ["7", "seven"]),                               # list label: first
        _inp("\\boxed{8}", {"answer": "8"}),                              # dict label
        _inp("\\boxed{1000}", "\\boxed{1000}"),                           # boxed gold unboxed
        _inp("\\boxed{1000001}", "1000000"),                              # integers exactly
    ]
    assert math_model.score(batch) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert math_model.last_stats == {"reward_timeouts": 0}
    assert math_model.score([]) == []


def test_math_timeout_scores_zero():
    from evaluation.grader import GradeOptions

    # Without the grader's guard sympy really evaluates the tower: only the worker kill ends it.
    with RewardModel(RewardConfig(rm_type="math", timeout=1.0, workers=2),
                     grade_options=GradeOptions(guard=False)) as model:
        assert model.score([_inp("\\boxed{1}", "1")] * 2) == [1.0] * 2  # both workers up: start-up not timed
        start = time.monotonic()
        rewards = model.score([_inp("\\boxed{2003^{2002^{2001}}}", "5"), _inp("\\boxed{2}", "2")])
        elapsed = time.monotonic() - start
    assert rewards == [0.0, 1.0]
    assert model.last_stats == {"reward_timeouts": 1}
    assert model.total_timeouts == 1
    assert 1.0 <= elapsed < 30.0  # the timeout waited for; only the kill ends the tower (bound loose for a loaded CPU)


def test_missing_label_is_an_error(math_model):
    with pytest.raises(ValueError, match="sample 1 has no label.*--label-key"):
        math_model.score([_inp("\\boxed{1}", "1"), _inp("\\boxed{1}", None)])


# --------------------------------------------------------------------------- gsm8k

def test_gsm8k():
    model = RewardModel(RewardConfig(rm_type="gsm8k"))
    batch = [
        _inp("She pays 3*24 = 72 dollars.\n#### 72", "72"),
        _inp("#### 1,000", "1000"),                    # thousands comma
        _inp("so 72.0 dollars", "72"),                 # no ####: last number, numerically equal
        _inp("#### 70\nno wait #### 72", "72"),        # the last #### wins
        _inp("#### 71", "72"),
        _inp("no number here", "72"),
        _inp("#### 18", "Janet sells 16 - 3 - 4 = 9 eggs; 9 * 2 = 18.\n#### 18"),  # label = solution
        _inp("answer -3", "-3"),
        _inp("#### $5", "5"),
    ]
    assert model.score(batch) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="gsm8k label"):
        model.score([_inp("#### 1", "one")])


# --------------------------------------------------------------------------- countdown / arithmetic

def test_countdown_rules():
    model = RewardModel(RewardConfig(rm_type="countdown"))
    label = json.dumps({"target": 16, "numbers": [3, 5, 2]})
    batch = [
        _inp("\\boxed{(3 + 5) * 2}", label),                       # (3+5)*2 = 16, each once
        _inp("\\boxed{2 * (5 + 3) = 16}", label),                  # "= target" tail is allowed
        _inp("\\boxed{(3 \\times 5) + 2 - 1}", label),            # 1 is not a given number
        _inp("\\boxed{(3 + 5) * 2 * 1}", label),
        _inp("\\boxed{(3 + 3) * 2}", label),                       # 3 twice, 5 unused
        _inp("\\boxed{3 * 5 + 2}", label),                         # 17, not 16
        _inp("\\boxed{__import__('os').system('true')}", label),   # never evaluated
        _inp("\\boxed{2 ** 5 - 3 - 5}", label),                    # ** is not an allowed operator
        _inp("\\boxed{(3 + 5) * 2", label),                        # truncated box
        _inp("\\boxed{" + "(" * 300 + "3+5" + ")" * 300 + "*2}", label),  # deep nesting
        _inp("\\boxed{3 / (5 - 5) + 2}", label),
    ]
    assert model.score(batch) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # a dict label works as well as its JSON string; division is exact: 3 / (5 - 2) * 16 = 16
    assert model.score([_inp("\\boxed{3 / (5 - 2) * 16}", {"target": 16, "numbers": [3, 5, 2, 16]})]) == [1.0]
    with pytest.raises(ValueError, match="countdown label"):
        model.score([_inp("\\boxed{1}", "16")])


def test_countdown_and_arithmetic_from_generator():
    from dataset.synthetic import make_rows

    countdown = make_rows("countdown", 20, seed=3, chat=False)
    arithmetic = make_rows("arithmetic", 20, seed=3, chat=False)
    model = RewardModel(RewardConfig(rm_type="countdown"))
    right = [_inp(f"\\boxed{{{r['solution']}}}", r["label"]) for r in countdown]
    assert model.score(right) == [1.0] * 20
    # every generated solution uses all numbers; dropping the last one breaks it
    wrong = [_inp("\\boxed{%s}" % " + ".join(map(str, json.loads(r["label"])["numbers"][:-1])), r["label"])
             for r in countdown]
    assert model.score(wrong) == [0.0] * 20

    model = RewardModel(RewardConfig(rm_type="arithmetic"))
    assert model.score([_inp(f"\\boxed{{{r['label']}}}", r["label"]) for r in arithmetic]) == [1.0] * 20
    assert model.score([_inp(f"\\boxed{{{int(r['label']) + 1}}}", r["label"]) for r in arithmetic]) == [0.0] * 20
    assert model.score([_inp("\\boxed{12.0}", "12"), _inp("so 12", "12"), _inp("\\boxed{1/2}", "12")]) == [1.0, 1.0, 0.0]


def test_chain_from_generator():
    from dataset.long_arith import ChainConfig, chain_rows

    rows = chain_rows(10, seed=2, config=ChainConfig(steps=6))
    model = RewardModel(RewardConfig(rm_type="chain"))
    assert model.score([_inp(r["solution"], r["label"]) for r in rows]) == [1.0] * 10
    # half the lines: half the credit; only the last total (the old tasks' answer): nothing
    half = [_inp("\n".join(r["solution"].split("\n")[:3]), r["label"]) for r in rows]
    assert model.score(half) == [0.5] * 10
    assert model.score([_inp(f"#### {r['totals'][-1]}", r["label"]) for r in rows]) == [0.0] * 10


def test_metadata_rm_type_overrides(math_model):
    batch = [_inp("\\boxed{0.5}", "\\frac12"), _inp("#### 4", "4", rm_type="gsm8k"),
             _inp("\\boxed{2 + 2}", {"target": 4, "numbers": [2, 2]}, rm_type="countdown")]
    assert math_model.score(batch) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="metadata rm_type 'nope'"):
        math_model.score([_inp("x", "1", rm_type="nope")])


# --------------------------------------------------------------------------- custom

def _module(monkeypatch, tmp_path, source: str) -> str:
    name = f"custom_rm_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_custom_sync_per_item_and_batched(monkeypatch, tmp_path):
    name = _module(monkeypatch, tmp_path, """
        from __future__ import annotations
        from trainer.rollout.samples.rewards import batched_reward

        def length(item):
            return len(item.response)

        def by_list(items: list[RewardInput]) -> list[float]:
            return [float(i.label) * 2 for i in items]

        @batched_reward
        def marked(items):
            return [True for _ in items]

        def bad_none(item):
            return None

        def bad_length(items: list) -> list:
            return [1.0]
    """)
    batch = [_inp("abc", "1"), _inp("hello", "2.5")]
    assert RewardModel(RewardConfig(custom_rm_path=f"{name}:length")).score(batch) == [3.0, 5.0]
    assert RewardModel(RewardConfig(custom_rm_path=f"{name}.length")).score(batch) == [3.0, 5.0]
    assert RewardModel(RewardConfig(custom_rm_path=f"{name}:by_list")).score(batch) == [2.0, 5.0]
    assert RewardModel(RewardConfig(custom_rm_path=f"{name}:marked")).score(batch) == [1.0, 1.0]
    with pytest.raises(TypeError, match=r"bad_none.*sample 0.*must be a number"):
        RewardModel(RewardConfig(custom_rm_path=f"{name}:bad_none")).score(batch)
    with pytest.raises(TypeError, match="list of 2 rewards, got 1 values"):
        RewardModel(RewardConfig(custom_rm_path=f"{name}:bad_length")).score(batch)


def test_custom_async_runs_concurrently(monkeypatch, tmp_path):
    name = _module(monkeypatch, tmp_path, """
        import asyncio

        async def slow(item):
            await asyncio.sleep(0.3)
            return 1.0 if item.response == item.label else 0.0

        arrived = []

        async def all_at_once(item):  # answers once all 8 items of the batch are running at once
            arrived.append(item)
            for _ in range(3000):  # 30 s: items run one after another never all arrive
                if len(arrived) == 8:
                    return 1.0 if item.response == item.label else 0.0
                await asyncio.sleep(0.01)
            raise TimeoutError("the items did not run concurrently")

        async def slow_batch(items: list):
            await asyncio.sleep(0.1)
            return [len(i.response) for i in items]

        def failing(item):
            raise KeyError("boom")
    """)
    batch = [_inp(str(i), str(i % 2)) for i in range(8)]
    together = RewardModel(RewardConfig(custom_rm_path=f"{name}:all_at_once"))
    assert together.score(batch) == [1.0, 1.0] + [0.0] * 6  # "0" == "0", "1" == "1"
    model = RewardModel(RewardConfig(custom_rm_path=f"{name}:slow"))
    assert RewardModel(RewardConfig(custom_rm_path=f"{name}:slow_batch")).score(batch) == [1.0] * 8

    async def inside_a_running_loop():  # e.g. an async rollout loop calling score()
        return model.score(batch[:2])

    assert asyncio.run(inside_a_running_loop()) == [1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"--custom-rm-path .*failing.* failed: KeyError"):
        RewardModel(RewardConfig(custom_rm_path=f"{name}:failing")).score(batch)


def test_custom_from_file_path(tmp_path):
    file = tmp_path / "my_reward.py"
    file.write_text("def rm(item):\n    return 0.25\n")
    assert RewardModel(RewardConfig(custom_rm_path=f"{file}:rm")).score([_inp("a", None)]) == [0.25]


def test_construction_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="--rm-type 'f1' is unknown"):
        RewardModel(RewardConfig(rm_type="f1"))
    with pytest.raises(ValueError, match=r"--custom-rm-path 'no_such_pkg_xyz\.mod:f'.*cannot import"):
        RewardModel(RewardConfig(custom_rm_path="no_such_pkg_xyz.mod:f"))
    name = _module(monkeypatch, tmp_path, "x = 1\n")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        RewardModel(RewardConfig(custom_rm_path=f"{name}:missing"))
    with pytest.raises(ValueError, match="'x' is not callable"):
        RewardModel(RewardConfig(custom_rm_path=f"{name}:x"))
    with pytest.raises(ValueError, match="expected 'pkg.module:func'"):
        RewardModel(RewardConfig(custom_rm_path="justaname"))
    with pytest.raises(ValueError, match="not found"):
        RewardModel(RewardConfig(custom_rm_path=str(tmp_path / "absent.py") + ":f"))
    with pytest.raises(ValueError, match="--reward-timeout"):
        RewardModel(RewardConfig(timeout=0))
    with pytest.raises(ValueError, match="--reward-workers"):
        RewardModel(RewardConfig(workers=0))


def test_flags():
    parser = add_reward_args(argparse.ArgumentParser())
    cfg = reward_config_from_args(parser.parse_args([]))
    assert cfg == RewardConfig(rm_type="math", custom_rm_path=None, timeout=5.0, workers=None)
    args = parser.parse_args(["--rm-type", "countdown", "--custom-rm-path", "a.b:c",
                              "--reward-timeout", "2.5", "--reward-workers", "3"])
    assert reward_config_from_args(args) == RewardConfig("countdown", "a.b:c", 2.5, 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["--rm-type", "f1"])
    help_text = parser.format_help()
    for flag in ("--rm-type", "--custom-rm-path", "--reward-timeout", "--reward-workers"):
        assert flag in help_text


def test_shuffled_batch_keeps_order(math_model):
    # rewards come back in input order whatever the mix of types and grading order
    rng = random.Random(0)
    items = [(_inp(f"\\boxed{{{i}}}", str(i if i % 3 else i + 1)), 0.0 if i % 3 == 0 else 1.0) for i in range(40)]
    items += [(_inp(f"#### {i}", str(i), rm_type="gsm8k"), 1.0) for i in range(10)]
    rng.shuffle(items)
    assert math_model.score([x for x, _ in items]) == [r for _, r in items]
