"""Hand-written gold/prediction cases for the grader, every rule in both directions.

Each case is (prediction, gold, expected). Predictions are bare answers unless they contain a
box or a sentence, in which case extraction runs first (as in the reward).
"""

import pytest

from evaluation.grader import answers_equal, grade

T, F = True, False

NUMBERS = [
    ("27", "27.0", T), ("27.0", "27", T), ("025", "25", T), ("-3", "-3", T), ("3", "-3", F),
    ("0.5", "\\frac{1}{2}", T), ("\\frac12", "0.5", T), ("\\dfrac{1}{4}", "\\frac{1}{4}", T),
    ("\\tfrac{3}{4}", "0.75", T), ("0.7", "\\frac{3}{4}", F), ("1/3", "\\frac{1}{3}", T),
    ("0.33333", "\\frac{1}{3}", T), ("0.33", "\\frac{1}{3}", F), ("\\frac{2}{4}", "\\frac{1}{2}", T),
    ("-\\frac{1}{2}", "-0.5", T), ("\\frac{1}{2}", "-0.5", F), ("1,000", "1000", T),
    ("1,000,000", "1000000", T), ("1000001", "1000000", F), ("1000000", "1000001", F),
    ("1.5\\times10^{3}", "1500", T), ("1.5 \\times 10^3", "1600", F), ("1e3", "1000", T),
    ("2\\frac{1}{2}", "\\frac{5}{2}", T), ("2\\frac{1}{2}", "1", F), (".5", "0.5", T),
    ("3.14159", "3.1416", T), ("3.14", "3.1416", F), ("10^{6}", "1000000", T), ("10^6", "100000", F),
    ("+5", "5", T), ("five", "5", T), ("six", "5", F), ("0", "0.0", T), ("0", "0.001", F),
]

PERCENT = [  # gold 7 vs prediction 700 must be wrong (the reference's x100 false positive)
    ("700", "7", F), ("7", "700", F), ("0.07", "7", F), ("50", "0.5", F), ("0.5", "50", F),
    ("50\\%", "0.5", T), ("50\\%", "50", T), ("50%", "50", T), ("0.5", "50\\%", T),
    ("50", "50\\%", T), ("25\\%", "0.5", F), ("12.5\\%", "\\frac{1}{8}", T), ("5%", "50", F),
]

INTERVALS_TUPLES = [
    ("(-2,1)", "[-2,1)", F), ("[-2,1)", "[-2,1)", T), ("[-2, 1)", "[-2,1)", T), ("[-2,1]", "[-2,1)", F),
    ("(-2,1]", "(-2,1)", F), ("(-\\infty, 2)", "(-\\infty,2)", T), ("(-\\infty,2]", "(-\\infty,2)", F),
    ("(3,\\infty)", "(3, \\infty)", T), ("[3,\\infty)", "(3,\\infty)", F),
    ("(2,12) \\cup (12,102)", "(2,12) \\cup (12,102)", T), ("(12,102)\\cup(2,12)", "(2,12) \\cup (12,102)", T),
    ("(2,12] \\cup (12,102)", "(2,12) \\cup (12,102)", F), ("(2,102)", "(2,12) \\cup (12,102)", F),
    ("(1,2)", "(1,2)", T), ("(2,1)", "(1,2)", F), ("(15,-29)", "(15, -29)", T), ("(-29,15)", "(15,-29)", F),
    ("(0.5, 3)", "(\\frac{1}{2}, 3)", T), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", T),
    ("(3, \\frac{\\pi}{3})", "\\left( 3, \\frac{\\pi}{2} \\right)", F), ("3, 4", "(3,4)", T),
    ("(1,2,3)", "(1,2,3)", T), ("(1,3,2)", "(1,2,3)", F), ("(1,2)", "(1,2,3)", F),
    ("\\left[ -\\frac{1}{2}, 3 \\right)", "[-0.5, 3)", T),
]

SETS_LISTS = [
    ("3,2,1", "\\{1,2,3\\}", T), ("\\{3,1,2\\}", "\\{1,2,3\\}", T), ("\\{1,2\\}", "\\{1,2,3\\}", F),
    ("\\{1,2,4\\}", "\\{1,2,3\\}", F), ("-2,1", "1,-2", T), ("-2, 1", "-2,1", T), ("-2,3", "-2,1", F),
    ("1, -2", "-2,1", T), ("1, 2, 2", "1, 2", F), ("\\frac{1}{2}, 3", "3, 0.5", T),
    ("48, 384", "$48$, $384$", T), ("48, 385", "$48$, $384$", F), ("2 and 3", "2, 3", T),
    ("(1,8,19), (2,7,13), (4,5,7)", "(4,5,7), (1,8,19), (2,7,13)", T),
    ("(1,8,19), (2,7,13), (4,5,8)", "(4,5,7), (1,8,19), (2,7,13)", F), ("\\emptyset", "\\varnothing", T),
    ("\\emptyset", "\\{0\\}", F),
]

MATRICES = [
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}", T),
    ("\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}", T),
    ("\\begin{pmatrix} 0 & -1 \\\\ -1 & 0 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}", F),
    ("\\begin{pmatrix} 1/2 & 0 \\\\ 0 & 1 \\end{pmatrix}", "\\begin{pmatrix}\\frac{1}{2}&0\\\\0&1\\end{pmatrix}", T),
    ("\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", T),
    ("\\begin{pmatrix} -18 \\\\ 49 \\\\ 96 \\end{pmatrix}", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", F),
    ("(-18, -49, 96)", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", T),
    ("(-18, 96, -49)", "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}", F),
    ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", F),
    ("\\begin{pmatrix} 1 & 2 & 3 \\\\ 4 & 5 & 6 \\end{pmatrix}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\\\ 5 & 6 \\end{pmatrix}", F),
    ("\\begin{pmatrix} \\sqrt{8} \\\\ 1 \\end{pmatrix}", "\\begin{pmatrix} 2\\sqrt{2} \\\\ 1 \\end{pmatrix}", T),
]

EQUATIONS = [
    ("y = 2x + 3", "2x - y + 3 = 0", T), ("2x - y + 3 = 0", "y=2x+3", T), ("y = 2x - 3", "y = 2x + 3", F),
    ("x + 2y + 3z = 4", "2x + 4y + 6z = 8", T), ("x + 2y + 3z = 4", "x + 2y + 3z = 5", F),
    ("x = 5", "5", T), ("5", "x=5", T), ("x = 6", "5", F), ("k=1", "1", T), ("f(x) = 2x", "2x", T),
    ("f(x) = 2x+1", "2x", F), ("x=1, y=2", "1, 2", T), ("\\frac{x^{2}}{2} - \\frac{y^{2}}{2} = 1", "x^2 - y^2 = 2", T),
    ("x^2 + y^2 = 2", "x^2 - y^2 = 2", F), ("\\theta = \\frac{\\pi}{2}", "\\frac{\\pi}{2}", T),
]

UNITS_TEXT = [
    ("15\\mbox{ cm}^2", "15", T), ("15", "15\\mbox{ cm}^2", T), ("16\\text{ cm}^2", "15\\mbox{ cm}^2", F),
    ("18 dollars", "18", T), ("\\$18", "18", T), ("\\$18.00", "18", T), ("\\$19", "18", F),
    ("76^\\circ", "76", T), ("76", "76^\\circ", T), ("75^{\\circ}", "76^\\circ", F), ("30°", "30", T),
    ("1.6 \\mathrm{~cm}", "1.6", T), ("2.6 \\mathrm{~cm}", "1.6", F), ("\\text{Devon}", "Devon", T),
    ("\\text{(C)}", "C", T), ("(C)", "C", T), ("B", "C", F), ("\\text{even}", "\\text{odd}", F),
    ("4 \\text{ inches}", "4", T), ("2 \\pi", "2\\pi", T), ("2", "2\\pi", F),
]

SYMBOLIC = [
    ("(x+1)^2", "x^2+2x+1", T), ("x^2+2x+1", "(x+1)^2", T), ("(x+1)^2", "x^2+x+1", F),
    ("\\sqrt{8}", "2\\sqrt2", T), ("2\\sqrt{2}", "\\sqrt{8}", T), ("\\sqrt{8}", "3\\sqrt{2}", F),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", T), ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{\\sqrt{3}}", F),
    ("1+2\\sqrt{3}", "2\\sqrt{3}+1", T), ("1-2\\sqrt{3}", "1+2\\sqrt{3}", F), ("6+9i", "9i+6", T),
    ("6-9i", "6+9i", F), ("\\frac{\\pi}{3}", "\\pi/3", T), ("\\frac{\\pi}{3}", "\\frac{\\pi}{6}", F),
    ("x^5 - x^4 + x^3 - x^2 + x - 1", "x^5-x^4+x^3-x^2+x-1", T),
    ("(x-1)(x^4+x^2+1)", "x^5 - x^4 + x^3 - x^2 + x - 1", T), ("(x+1)(x^4+x^2+1)", "x^5 - x^4 + x^3 - x^2 + x - 1", F),
    ("2^{10}", "1024", T), ("2^{10}", "1025", F), ("2^{20}", "1048577", F), ("\\frac{1}{2 n+2}", "\\frac{1}{2(n+1)}", T),
    ("\\frac{1}{2n+1}", "\\frac{1}{2 n+2}", F), ("2n-2", "2(n-1)", T), ("2n", "3n", F), ("1.4142", "\\sqrt{2}", T),
    ("1.41", "\\sqrt{2}", F), ("sqrt(2)/2", "\\frac{\\sqrt{2}}{2}", T), ("e^{i\\pi}", "-1", T), ("\\infty", "\\infty", T),
    ("-\\infty", "\\infty", F), ("2003^{2002^{2001}}", "5", F),
]

EXTRACT_THEN_GRADE = [  # whole completions (the reward's input)
    ("So the answer is \\boxed{\\frac14}.", "\\frac{1}{4}", T),
    ("We get \\boxed{0.25}", "\\frac{1}{4}", T),
    ("Thus $x \\in \\boxed{(-2,1)}$", "[-2,1)", F),
    ("\\boxed{2} wait no, that is wrong: \\boxed{3}", "3", T),
    ("\\boxed{2} wait no, that is wrong: \\boxed{3}", "2", F),
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18", T),
    ("The final answer is $18$. I hope it is correct.", "18", T),
    ("The total is 16 - 3 - 4 = 9 eggs, so 9 * 2 = 18 dollars", "18", T),
    ("The total is 16 - 3 - 4 = 9 eggs, so 9 * 2 = 18 dollars", "9", F),
    ("Therefore, the answer is $\\frac{1}{2}$.", "0.5", T),
    ("<think>2+2</think> <answer> 4 </answer>", "4", T),
    ("<think>2+2</think> <answer> 5 </answer>", "4", F),
    ("Therefore, the answer is $\\$32,\\!348$.", "\\$32,\\!348", T),
    ("Therefore, the answer is $\\$32,\\!349$.", "\\$32,\\!348", F),
    ("\\fbox{42}", "42", T), ("\\boxed{\\text{(B)}}", "B", T), ("\\boxed{700}", "7", F),
    ("truncated \\boxed{\\frac{1}{", "1", F), ("no answer here", "1", F), ("", "1", F),
    ("\\frac{1}{4}", "\\boxed{\\frac{1}{4}}", T), ("\\boxed{x = 3}", "3", T),
]

ALL = NUMBERS + PERCENT + INTERVALS_TUPLES + SETS_LISTS + MATRICES + EQUATIONS + UNITS_TEXT + SYMBOLIC


def test_case_count_and_balance():
    cases = ALL + EXTRACT_THEN_GRADE
    assert len(cases) >= 150
    assert sum(1 for c in cases if c[2]) >= 50 and sum(1 for c in cases if not c[2]) >= 50


@pytest.mark.parametrize("pred,gold,expected", ALL)
def test_answers_equal(pred, gold, expected):
    assert answers_equal(pred, gold) is expected


@pytest.mark.parametrize("pred,gold,expected", ALL + EXTRACT_THEN_GRADE)
def test_grade(pred, gold, expected):
    assert grade(pred, gold) is expected


def test_none_and_empty():
    assert answers_equal(None, "1") is False
    assert answers_equal("1", None) is False
    assert grade(None, "1") is False
    assert grade("\\boxed{3}", ["3", "4"]) is True  # olympiadbench: list gold, first element
