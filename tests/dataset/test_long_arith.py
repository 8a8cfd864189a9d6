"""dataset.long_arith: running-sum rows are deterministic by seed, their labels and solutions
agree with an independent computation and with the prompt, and the CLI writes valid rows."""

import itertools
import json
import re

import pytest

from dataset.long_arith import PATTERNS, ChainConfig, chain_rows, main
from dataset.validate import validate_file


def test_deterministic_by_seed():
    config = ChainConfig(steps=15, pattern="random")
    assert chain_rows(40, seed=3, config=config) == chain_rows(40, seed=3, config=config)
    assert chain_rows(40, seed=3, config=config) != chain_rows(40, seed=4, config=config)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_labels_match_an_independent_computation(pattern):
    config = ChainConfig(steps=10, max_number=7, max_start=40, pattern=pattern)
    for row in chain_rows(50, seed=11, config=config):
        label = json.loads(row["label"])
        question = row["prompt"][0]["content"]
        start, steps = label["start"], label["steps"]
        running = list(itertools.accumulate(steps, initial=start))
        assert re.match(rf"Start with {start}\. ", question) and "Write all 10 lines." in question
        assert 10 <= start <= 40 and len(steps) == 10 and row["totals"] == running[1:]
        lines = [tuple(map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)", line).groups()))
                 for line in row["solution"].split("\n")]
        assert lines == [(running[i], steps[i], running[i + 1]) for i in range(10)]
        if pattern == "random":
            listed = re.search(r"in order: ([\d, ]+)\.", question).group(1)
            assert [int(x) for x in listed.split(", ")] == steps and all(1 <= x <= 7 for x in steps)
        elif pattern == "constant":
            assert len(set(steps)) == 1 and f"add {steps[0]} to the total 10 times" in question
        else:
            assert steps == list(range(1, 11)) and "up to 10," in question


def test_default_is_the_measured_task():
    # docs/long_task.md measured 25 listed numbers of 1..9 from a start of 10..50
    assert ChainConfig() == ChainConfig(steps=25, max_number=9, max_start=50, pattern="random")


def test_bad_pattern_raises():
    with pytest.raises(ValueError, match="unknown chain pattern"):
        chain_rows(1, seed=0, config=ChainConfig(pattern="fibonacci"))


def test_cli_writes_valid_rows(tmp_path):
    out = tmp_path / "chain.jsonl"
    assert main(["--n", "25", "--out", str(out), "--steps", "8", "--pattern", "increasing"]) == 0
    report = validate_file(out)
    assert report.rows == 25 and not report.errors
    with pytest.raises(SystemExit):
        main(["--n", "0", "--out", str(out)])


def _long_row():
    from dataset.long_arith import long_chain_rows

    return long_chain_rows(1, seed=5)[0]


def test_long_variant_lists_100_numbers_and_answers_every_step():
    from dataset.long_arith import long_chain_demos, long_chain_rows

    rows = long_chain_rows(20, seed=5)
    assert rows == long_chain_rows(20, seed=5) and rows != long_chain_rows(20, seed=6)
    for row in rows:
        label = json.loads(row["label"])
        question = row["prompt"][0]["content"]
        listed = re.search(r"in order: ([\d ]+)\.", question).group(1)  # space-separated
        assert [int(x) for x in listed.split(" ")] == label["steps"] and len(label["steps"]) == 100
        assert "Write all 100 lines." in question and row["task"] == "chain"
        running = list(itertools.accumulate(label["steps"], initial=label["start"]))
        assert row["solution"].split("\n") == [f"{running[i]} + {label['steps'][i]} = {running[i + 1]}"
                                               for i in range(100)]
    # the warm-up's worked answers are the same task at half the length (GRPO learns the rest)
    demos = long_chain_demos(4, seed=10_005)
    assert all(len(json.loads(d["label"])["steps"]) == 50 and d["solution"].count("\n") == 49 for d in demos)


def test_long_variant_reward_on_hand_built_answers():
    """``score_chain`` on a 100-step answer: 1/100 a right line. Hand-built: the full answer 1.0;
    its first 50 lines 0.50 (what the warm-up's answer length earns); one wrong sum at line 30
    carried forward 0.99; line 60 dropped (every later number one off) 0.59 minus the later
    lines that add the same number by chance; prose and the prompt's example around it change
    nothing. Mutation check: crediting steps without checking the listed number
    (``b == steps[i]`` removed in score_chain) makes the dropped-line case score 0.99 and fails."""
    from evaluation.grader import score_chain

    row = _long_row()
    label, lines = row["label"], row["solution"].split("\n")
    steps = json.loads(label)["steps"]
    assert score_chain(row["solution"], label) == 1.0
    assert score_chain("\n".join(lines[:50]), label) == 0.5
    a, b, c = map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)", lines[29]).groups())
    wrong = lines[:29] + [f"{a} + {b} = {c + 1}"]  # the next lines continue from the written total
    for i in range(30, 100):
        wrong.append(f"{c + 1 + sum(steps[30:i])} + {steps[i]} = {c + 1 + sum(steps[30:i + 1])}")
    assert score_chain("\n".join(wrong), label) == pytest.approx(0.99)
    dropped = lines[:59] + [_shifted(lines[59], steps[60])] + [
        f"{int(lines[59].split()[0]) + steps[60] + sum(steps[61:i])} + {steps[i]} = "
        f"{int(lines[59].split()[0]) + steps[60] + sum(steps[61:i + 1])}" for i in range(61, 100)]
    by_chance = sum(steps[i + 1] == steps[i] for i in range(59, 99))  # the i-th line adds steps[i+1]
    assert score_chain("\n".join(dropped), label) == pytest.approx((59 + by_chance) / 100)
    wrapped = "Sure! 10 + 3 = 13\n13 + 4 = 17\nHere goes:\n" + row["solution"] + "\nDone, all 100 lines."
    assert score_chain(wrapped, label) == 1.0


def _shifted(line: str, number: int) -> str:
    """Line 60 of the answer with step 61's number instead of step 60's (step 60 skipped)."""
    total = int(line.split()[0])
    return f"{total} + {number} = {total + number}"


def test_quickstart_registers_the_long_variant():
    from trainer.quickstart import SMOLLM2_TASKS, task_of

    task = task_of("smollm2", "chain100")
    assert task is SMOLLM2_TASKS["chain100"] and task.rm_type == "chain"
    rows, demos = task.rows(3, 7), task.demos(3, 7)
    assert len(json.loads(rows[0]["label"])["steps"]) == 100 and len(json.loads(demos[0]["label"])["steps"]) == 50
    # a full answer is 1,153-1,185 SmolLM2 tokens, the prompt 320: the cap leaves room, the pool both
    assert task.max_len >= 1200 and task.sample_tokens >= task.max_len + 320
