"""evaluation.grader's ``chain`` scorer (running sums, every step checked) against hand-computed
values, and against the generator's own rows."""

import json

import pytest

from dataset.long_arith import ChainConfig, chain_rows
from evaluation.grader import chain_equations, score_chain

# 10, +3 -> 13, +4 -> 17, +5 -> 22, +6 -> 28
LABEL = json.dumps({"start": 10, "steps": [3, 4, 5, 6]})
FULL = "10 + 3 = 13\n13 + 4 = 17\n17 + 5 = 22\n22 + 6 = 28"


def test_full_credit_in_any_layout():
    assert score_chain(FULL, LABEL) == 1.0
    assert score_chain("10+3=13, 13+4=17, 17+5=22, 22+6=28.", LABEL) == 1.0
    assert score_chain("Sure!\n1. 10 + 3 = 13\n2. 13 + 4 = 17\n3. 17 + 5 = 22\n4. 22 + 6 = 28\nDone", LABEL) == 1.0
    assert score_chain(FULL, {"start": 10, "steps": [3, 4, 5, 6]}) == 1.0  # dict label
    assert score_chain(FULL + "\n28 + 7 = 35", LABEL) == 1.0  # lines past the last step are ignored


def test_partial_credit():
    # a wrong sum loses its own step; the next continues from the written total (13 + 4 = 18)
    assert score_chain("10 + 3 = 13\n13 + 4 = 18\n18 + 5 = 23\n23 + 6 = 29", LABEL) == 0.75
    assert score_chain("10 + 3 = 13\n13 + 4 = 17", LABEL) == 0.5  # cut after two steps
    assert score_chain("10 + 3 = 14\n14 + 4 = 19\n19 + 5 = 25\n25 + 6 = 30", LABEL) == 0.0  # every sum wrong


def test_missing_repeated_and_reordered_steps():
    # step 2 (+4) skipped: each later line adds the number of the step before it
    assert score_chain("10 + 3 = 13\n13 + 5 = 18\n18 + 6 = 24", LABEL) == 0.25
    # a repeated line does not continue the chain (it starts from 10, not 13): earns nothing more
    assert score_chain("10 + 3 = 13\n10 + 3 = 13\n10 + 3 = 13\n10 + 3 = 13", LABEL) == 0.25
    # reversed: only the line starting from 10 continues the chain, and nothing follows it
    assert score_chain("22 + 6 = 28\n17 + 5 = 22\n13 + 4 = 17\n10 + 3 = 13", LABEL) == 0.25
    # the prompt's example (another start) and prose equations are skipped
    assert score_chain("For example 1 + 3 = 4 and 4 + 4 = 8.\n" + FULL, LABEL) == 1.0
    # a wrong operator makes step 1 wrong; step 2 goes on from its 7 and is right
    assert score_chain("10 - 3 = 7\n7 + 4 = 11", LABEL) == 0.25


def test_malformed_text_scores_zero():
    for text in ("", None, "the total is 28", "10 + 3 = 13.5\n13.5 + 4 = 17.5", "10 + 3 =\n= 13",
                 "110 + 3 = 113", "10 + 3 = 130", "x" * 100_000):
        assert score_chain(text, LABEL) == 0.0, text
    # whole numbers only: "110 + 3 = 113" is not read as "10 + 3 = 113", "= 13.5" not as 13
    assert chain_equations("110 + 3 = 113") == [(110, 3, 113)]
    assert chain_equations("10 + 3 = 13.5 and 2 - 1 = 1.") == [(2, -1, 1)]


def test_subtraction_steps():
    label = {"start": 20, "steps": [-5, 3, -8]}  # 15, 18, 10
    assert score_chain("20 - 5 = 15\n15 + 3 = 18\n18 - 8 = 10", label) == 1.0
    assert score_chain("20 \u2212 5 = 15\n15 + 3 = 18\n18 \u2013 8 = 10", label) == 1.0  # typeset minus / dash
    assert score_chain("20 + 5 = 25\n25 + 3 = 28", label) == pytest.approx(1 / 3)


def test_bad_labels_raise():
    for label in ("not json", '{"start": 1}', '{"start": 1, "steps": []}', "[1, 2]", {"steps": [1]}):
        with pytest.raises(ValueError, match="chain label"):
            score_chain(FULL, label)


@pytest.mark.parametrize("pattern", ["random", "constant", "increasing"])
def test_generated_rows_are_scored(pattern):
    for row in chain_rows(30, seed=5, config=ChainConfig(steps=12, pattern=pattern)):
        assert score_chain(row["solution"], row["label"]) == 1.0
        assert score_chain(row["solution"].rsplit("\n", 3)[0], row["label"]) == pytest.approx(9 / 12)
        # the old tasks' answer, the last total alone, earns nothing
        assert score_chain(f"The answer is {row['totals'][-1]}.", row["label"]) == 0.0
