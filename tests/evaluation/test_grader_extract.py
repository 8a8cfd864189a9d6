"""Answer extraction: boxes with nested braces, \\fbox, "the answer is", ####, last number."""

import pytest

from evaluation.grader import boxed_contents, extract_answer, normalize

CASES = [
    ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{\\left(2+\\frac{1}{x}\\right)}}", "\\frac{\\sqrt{3}}{\\left(2+\\frac{1}{x}\\right)}"),
    ("first \\boxed{2}, then \\boxed{3}", "3"),
    ("$\\boxed{\\{1,2\\}}$", "\\{1,2\\}"),
    ("\\fbox{17}", "17"),
    ("\\boxed{1} and finally \\fbox{2}", "2"),
    ("so $\\boxed 5$.", "5"),
    ("\\boxed {7}", "7"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("Thus the answer is 42.", "42"),
    ("So the final answer is $\\frac{3}{4}$. Done", "\\frac{3}{4}"),
    ("The answer is: 3.5\nmore text 99", "3.5"),
    ("Answer: 12", "12"),
    ("Therefore, the answer is $\\$18.90$.", "\\$18.90"),  # an escaped dollar inside $...$
    ("The final answer is $8$. I hope it is correct.", "8"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("I computed 3 + 4 = 7 and then 7 * 2 = 14", "14"),
    ("It costs 1,000,000 dollars.", "1000000"),
    ("the value is -3.5.", "-3.5"),
    ("<think>maybe 3</think><answer>The answer is 4</answer>", "4"),
    ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}"),
    ("<answer>x</answer> and \\boxed{9}", "9"),
    ("no digits at all", None),
    ("", None),
    (None, None),
    ("\\boxed{3} but then \\boxed{\\frac{1}{", None),  # cut inside the final box
]


@pytest.mark.parametrize("text,expected", CASES)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_boxed_contents_all_in_order():
    assert boxed_contents("\\boxed{a} x \\fbox{b{c}} \\boxed{d") == ["a", "b{c}"]


@pytest.mark.parametrize("raw,expected", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "( 3, \\frac{\\pi}{2} )"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("$18$.", "18"),
    ("10\\%", "10%"),
    ("15\\mbox{ cm}^2", "15"),
    ("76^\\circ", "76"),
    ("\\text{Devon}", "Devon"),
    ("1,234", "1234"),
    ("x \\in \\emptyset", "x \\in \\emptyset"),
    ("2 \\pi", "2 \\pi"),
])
def test_normalize(raw, expected):
    assert normalize(raw) == expected
