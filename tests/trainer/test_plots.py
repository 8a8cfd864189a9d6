"""The training plots people read: no flat panel (a constant series is named in the title
instead), no line hidden under another (an identical series is not drawn twice: one line,
labelled with both names; lines that differ have different styles and markers), legends beside
the axes rather than over the data.

Mutation checks: `constant = {}` in plot_panels fails test_constant_series_get_no_panel; giving
every line the first style, or dropping the same_as check, fails
test_identical_lines_are_told_apart."""

from __future__ import annotations

import json

import matplotlib
import matplotlib.axes
import pytest

from trainer.tracking import plot_metrics, plot_panels


def _s(*ys):
    return list(range(len(ys))), [float(y) for y in ys]


def test_panels_only_for_varying_series():
    series = {"kv_peak_slots_per_sample": _s(100, 130, 90), "kv_pool_capacity": _s(4096, 4096, 4096),
              "kv_compressions_per_sample": _s(0, 2, 3), "kv_peak_slots_max": _s(600, 600, 600)}
    p = plot_panels(series, separate=True)
    assert list(p.drawn) == ["kv_peak_slots_per_sample", "kv_compressions_per_sample"]
    assert p.constant == {"kv_pool_capacity": 4096.0, "kv_peak_slots_max": 600.0}


def test_all_constant_or_single_points_are_still_drawn():
    assert list(plot_panels({"a": _s(1, 1), "b": _s(2, 2)}, True).drawn) == ["a", "b"]
    assert plot_panels({"a": _s(5), "b": _s(1, 2)}, True).constant == {}  # one point: not flat
    assert plot_panels({"a": _s(1, 1), "b": _s(1, 2)}, False).constant == {}  # one shared axes


def test_identical_series_are_marked():
    series = {"reward_mean": _s(0.1, 0.5), "raw_reward_mean": _s(0.2, 0.4), "accuracy": _s(0.1, 0.5)}
    p = plot_panels(series, separate=False)
    assert p.same_as == {"accuracy": "reward_mean"}
    assert list(p.drawn) == ["reward_mean", "raw_reward_mean"]


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Run plot_metrics on rows and record every line and legend it draws."""
    lines, legends, titles = [], [], []
    plot, legend, title = (matplotlib.axes.Axes.plot, matplotlib.axes.Axes.legend,
                           matplotlib.axes.Axes.set_title)

    def record_plot(ax, *args, **kw):
        lines.append(kw)
        return plot(ax, *args, **kw)

    def record_legend(ax, *args, **kw):
        legends.append(kw)
        return legend(ax, *args, **kw)

    def record_title(ax, text, *args, **kw):
        titles.append(text)
        return title(ax, text, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", record_plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "legend", record_legend)
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", record_title)

    def run(rows):
        path = tmp_path / "metrics.jsonl"
        path.write_text("".join(json.dumps(dict(r, step=i)) + "\n" for i, r in enumerate(rows)))
        return plot_metrics(path, tmp_path), lines, legends, titles
    return run


def test_identical_lines_are_told_apart(drawn):
    rows = [{"reward_mean": r, "accuracy": r, "raw_reward_mean": 2 * r - 1}  # 0/1 rewards
            for r in (0.0, 0.25, 0.5)]
    _, lines, legends, _ = drawn(rows)
    reward, raw = lines
    assert reward["label"] == "reward_mean = accuracy" and raw["label"] == "raw_reward_mean"
    assert (reward["linestyle"], reward["marker"]) != (raw["linestyle"], raw["marker"])
    assert legends[0]["loc"] == "upper left" and legends[0]["bbox_to_anchor"][0] > 1  # beside


def test_constant_series_get_no_panel(drawn):
    rows = [{"kv_peak_slots_per_sample": 100.0 + 10 * i, "kv_pool_capacity": 4096.0,
             "kv_pool_peak_bytes": 2.0**30, "correction_fractions/masked_fraction": 0.1 * i,
             "correction_fractions/clip_fraction": 0.05} for i in range(3)]
    paths, lines, legends, titles = drawn(rows)
    assert [p.name for p in paths] == ["correction_fractions.png", "kv_memory.png"]
    labels = [kw.get("label") for kw in lines]
    assert "kv_pool_capacity" not in labels and "kv_pool_peak_bytes (GiB)" not in labels
    kv_title = next(t for t in titles if t.startswith("KV memory"))
    assert "constant, not drawn: kv_pool_capacity = 4096, kv_pool_peak_bytes = 1 GiB" in kv_title
    assert all(kw["loc"] == "upper left" and kw["bbox_to_anchor"][0] > 1 for kw in legends)
