"""pass@k against brute-force enumeration; benchmark gold fields; prompt templates."""

import itertools
import json
from fractions import Fraction
from pathlib import Path

import pytest

from evaluation.benchmarks import BENCHMARKS, load_benchmark
from evaluation.metrics import benchmark_metrics, k_values, pass_at_k
from evaluation.prompts import TEMPLATES, get_template

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "eval"


def brute_force_pass_at_k(n, c, k):
    """Fraction of all k-subsets of n samples (c of them correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_large_n_is_stable_and_rejects_bad_input():
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert 0.0 < pass_at_k(1000, 3, 32) < 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(32) == [1, 2, 4, 8, 16, 32]
    assert k_values(6) == [1, 2, 4, 6]


def test_benchmark_metrics_by_hand():
    records = [
        {"scores": [True, False], "finish_reasons": ["stop", "length"], "response_tokens": [10, 30],
         "grader_timeouts": [False, True], "extracted": ["1", None]},
        {"scores": [False, False], "finish_reasons": ["stop", "stop"], "response_tokens": [20, None],
         "grader_timeouts": [False, False], "extracted": ["2", "3"]},
    ]
    m = benchmark_metrics(records)
    assert m["avg@2"] == 25.0 and m["pass@k"] == {"1": 25.0, "2": 50.0}
    assert m["truncation_ratio"] == 0.25 and m["mean_response_tokens"] == 20.0
    assert m["grader_timeouts"] == 1 and m["empty_answers"] == 1


GOLD_EXAMPLES = {  # first row's gold as the reference harness reads it (eval.md section 1.4)
    "gsm8k": "18", "math500": "\\left( 3, \\frac{\\pi}{2} \\right)", "aime24": "204", "amc23": "27.0",
    "olympiadbench": "2", "gaokao2023en": "\\{x|-2\\leq x < 1\\}", "minerva_math": "1.6",
}
SIZES = {"gsm8k": 1319, "math500": 500, "minerva_math": 272, "olympiadbench": 675, "gaokao2023en": 385,
         "aime24": 30, "amc23": 40}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_shared_benchmark_files_load(name):
    if not (DATA / name / "test.jsonl").is_file():
        pytest.skip(f"shared data not present at {DATA}")
    problems = load_benchmark(name, DATA)
    assert len(problems) == SIZES[name]
    assert problems[0].gold == GOLD_EXAMPLES[name]
    assert all(p.question for p in problems)
    # the public gaokao2023en file has two rows with an empty answer; every other gold is set
    assert sum(not p.gold for p in problems) == (2 if name == "gaokao2023en" else 0)


def test_local_jsonl_and_bad_rows(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text(json.dumps({"problem": "1+1?", "solution": "so \\boxed{2}"}) + "\n"
                    + json.dumps({"question": "Is 2 even?", "label": "Yes"}) + "\n")
    problems = load_benchmark(str(good))
    assert [p.gold for p in problems] == ["2", "Yes"]
    assert problems[1].question.endswith("(Yes or No)")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=f"{bad}:2"):
        load_benchmark(str(bad))
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("mathh500")


def test_prompt_templates():
    q = "What is 1+1?"
    boxed = get_template("qwen-boxed").render(q)
    assert boxed == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                     "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
                     "<|im_end|>\n<|im_start|>assistant\n")
    cot = get_template("qwen25-math-cot").render(q)
    assert cot.startswith("<|im_start|>system\nPlease reason step by step") and "user\nWhat is 1+1?<|im_end|>" in cot
    assert get_template("abel").render(q) == "Question:\nWhat is 1+1?\nAnswer:\nLet's think step by step.\n"
    r1 = get_template("deepseek-r1").render(q)
    assert "<answer>" in r1 and r1.endswith("Assistant: <think>")
    with pytest.raises(ValueError, match="tokenizer"):
        get_template("chat").render(q)
    with pytest.raises(ValueError, match="unknown prompt template"):
        get_template("nope")
    assert set(TEMPLATES) == {"qwen-boxed", "qwen25-math-cot", "abel", "deepseek-r1", "chat"}


def test_chat_template_through_tokenizer():
    tiny = pytest.importorskip("checkpoint_tools.tiny_models")
    tokenizer = tiny.train_tokenizer()
    text = get_template("chat").render("What is 1+1?", tokenizer)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")
