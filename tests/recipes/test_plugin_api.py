"""The generate plug-in API as documented: recipes/README.md's example runs as written (on the
scripted engine) and gives the traces it promises; plug-in loading errors name the flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer.rollout.samples.data import Prompt
from trainer.rollout.samples.generate import load_generate_plugin, parse_options, run_plugin

ROOT = Path(__file__).resolve().parents[2]


def _readme_example(tmp_path) -> Path:
    text = (ROOT / "recipes" / "README.md").read_text()
    code = re.search(r"```python\n(# draft_answer\.py.*?)```", text, re.DOTALL).group(1)
    path = tmp_path / "draft_answer.py"
    path.write_text(code)
    return path


def test_the_readme_example_runs(scripted, tmp_path):
    plugin = load_generate_plugin(f"{_readme_example(tmp_path)}:draft_then_answer", {})
    ctx, backend = scripted(lambda p, k: "42" if p.endswith("Final answer:") else f"draft {k}")
    prompt = Prompt("Q?", ctx.encode("Q?"), "42", {})
    traces = run_plugin(plugin, ctx, [prompt], 2)
    assert len(traces) == 2 and all(len(t.calls) == 2 for t in traces)
    draft, answer = traces[1].calls
    assert ctx.decode(answer.prompt_ids) == "Q?draft 1\nFinal answer:"
    assert [c.loss_weight for c in traces[0].calls] == [0.5, 0.5] and traces[0].text == "42"
    assert [p["max_new_tokens"] for _, p in backend.requests] == [64, 64, 16, 16]


def test_options_and_loading_errors(tmp_path):
    assert parse_options(["rounds=3", "name=abc", "on=true", "x=0.5"]) == \
        {"rounds": 3, "name": "abc", "on": True, "x": 0.5}
    with pytest.raises(ValueError, match="key=value"):
        parse_options(["rounds"])
    with pytest.raises(ValueError, match="--custom-generate-function-path"):
        load_generate_plugin("no.such.module:fn", {})
    with pytest.raises(ValueError, match="bad --custom-generate-args"):
        load_generate_plugin("recipes.rc:ReasoningCache", {"no_such_option": 1})
    with pytest.raises(ValueError, match="is a function"):
        load_generate_plugin(f"{_readme_example(tmp_path)}:draft_then_answer", {"a": 1})


def test_a_plugin_must_return_traces(scripted):
    ctx, _ = scripted(lambda p, k: "x")
    with pytest.raises(TypeError, match="list of Trace"):
        run_plugin(lambda ctx, prompts, n: ["not a trace"], ctx, [], 1)
