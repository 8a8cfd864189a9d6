"""evaluation.grader's task scoring and the extraction the rewards use: the final box, GSM8K
numbers, exact numbers, the countdown checker (also against generated tasks)."""

import json
import random

from dataset.synthetic import countdown_task
from evaluation.grader import check_countdown, exact_number, final_boxed, gsm8k_answer, score_countdown


def test_final_boxed():
    assert final_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert final_boxed("\\fbox{3}") == "3"
    assert final_boxed("\\boxed 5$") == "5"
    assert final_boxed("\\boxed{1} \\boxed{2") is None
    assert final_boxed("nothing") is None


def test_number_helpers():
    from fractions import Fraction

    assert gsm8k_answer("a 1,234.5 b") == "1234.5"
    assert gsm8k_answer("#### 12\nthen 13") == "12"
    assert exact_number("$1,000.$") == 1000
    assert exact_number("\\frac{3}{4}") == Fraction(3, 4)
    assert exact_number("0.5") == Fraction(1, 2)
    for bad in ("nan", "1e5", "x", "", None, "1" * 200):
        assert exact_number(bad) is None


def test_countdown_tasks_are_solvable_and_checked():
    rng = random.Random(0)
    for _ in range(200):
        task = countdown_task(rng)
        assert check_countdown(task["solution"], task["numbers"], task["target"])
        assert 1 <= task["target"] <= 999 and 3 <= len(task["numbers"]) <= 4
    assert check_countdown("(1 + 2) * 3", [3, 2, 1], 9)
    assert not check_countdown("(1 + 2) * 3", [3, 2, 1], 10)       # wrong value
    assert not check_countdown("(1 + 2) * 3 * 1", [3, 2, 1], 9)   # 1 used twice
    assert not check_countdown("1 + 2", [3, 2, 1], 3)             # 3 unused
    assert not check_countdown("__import__('os')", [1], 1)        # no calls
    assert check_countdown("6 / 4 * 2", [6, 4, 2], 3)             # exact rational arithmetic
    label = json.dumps({"target": 9, "numbers": [1, 2, 3]})
    assert score_countdown("so \\boxed{(1 + 2) \\times 3}", label)
    assert not score_countdown("so \\boxed{1 + 2 + 3}", label)
