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
