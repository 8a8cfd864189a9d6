"""dataset.lookup_tool: orders whose prices only the row's table holds; the warm-up's rows show
the format (one or two items, three-digit prices) on other values and shorter orders than the
training and held-out rows (two to four items, two-digit prices)."""

from __future__ import annotations

import json
import re

import pytest

from dataset.lookup_tool import lookup_tool_rows, main


def _order(row) -> list[tuple[int, str]]:
    question = row["prompt"][-1]["content"]
    return [(int(q), item) for q, item in re.findall(r"(\d+) (\w+?)s\b", question)]


def test_label_is_the_orders_total_from_the_hidden_table():
    for row in lookup_tool_rows(50, seed=3):
        order, table = _order(row), row["table"]
        assert 2 <= len(order) <= 4 and len(table) == len(order) + 2
        assert int(row["label"]) == sum(q * table[item] for q, item in order)
        shown = json.dumps(row["prompt"])
        assert not any(re.search(rf"\b{price}\b", shown) for price in table.values())  # prices hidden


def test_worked_episode_looks_up_then_computes_then_answers():
    row = lookup_tool_rows(1, seed=0)[0]
    first, second, answer = row["solution_turns"]
    assert first.count('"name": "lookup"') == len(_order(row)) and '"calculator"' in second
    assert answer == f"\\boxed{{{row['label']}}}"
    assert row["observations"][1] == f"<tool_response>\n{row['label']}\n</tool_response>"


def test_warm_up_rows_differ_in_shape_and_values():
    demos, rows = lookup_tool_rows(200, seed=10_000, demos=True), lookup_tool_rows(200, seed=1)
    assert {len(_order(r)) for r in demos} == {1, 2}
    assert all(100 <= p <= 999 for r in demos for p in r["table"].values())
    assert all(11 <= p <= 99 for r in rows for p in r["table"].values())
    assert {len(_order(r)) for r in rows} == {2, 3, 4}


def test_a_two_item_demo_shows_both_lookups_in_one_turn_and_one_sum():
    row = next(r for r in lookup_tool_rows(50, seed=10_000, demos=True) if len(_order(r)) == 2)
    (q1, a), (q2, b) = _order(row)
    lookups, calculator, _ = row["solution_turns"]
    assert lookups.count("<tool_call>") == 2 and f'"item": "{a}"' in lookups and f'"item": "{b}"' in lookups
    assert f'"expression": "{q1} * {row["table"][a]} + {q2} * {row["table"][b]}"' in calculator


def test_tiny_rows_are_short_chatml_strings():
    row = lookup_tool_rows(1, seed=0, style="tiny")[0]
    assert row["prompt"].startswith("<|im_start|>user\nprice ") and all(p < 10 for p in row["table"].values())


def test_cli_writes_rows_and_refuses_a_bad_n(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["--n", "3", "--out", str(out), "--demos"]) == 0
    assert len(out.read_text().splitlines()) == 3
    with pytest.raises(SystemExit):
        main(["--n", "0", "--out", str(out)])
    assert "--n must be >= 1" in capsys.readouterr().err
