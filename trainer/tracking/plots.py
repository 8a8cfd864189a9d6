"""PNG plots of the logged metrics, one figure per group of keys (``keys.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .keys import is_eval, is_fraction, is_kv, is_mismatch, is_response_length, is_reward, key_series
from .logger import read_metrics

_PLOTS = (
    # file name, title, key filter, one axes per key (for keys of different scales)
    ("reward.png", "Reward", is_reward, False),
    ("response_length.png", "Response length (tokens)", is_response_length, False),
    ("rollout_train_kl.png", "Rollout (sparse) vs train (dense) mismatch", is_mismatch, True),
    ("correction_fractions.png", "Correction fractions", is_fraction, False),
    ("kv_memory.png", "KV memory per rollout", is_kv, True),
    ("eval.png", "Evaluation", is_eval, True),
)


def dense_kv_slots(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Per rollout, the KV slots a sample would hold at its end without compression: its mean
    prompt plus response tokens (the reference line of ``kv_peak_slots_per_sample``)."""
    xs, prompts = key_series(rows, "prompt_len_mean")
    responses = dict(zip(*key_series(rows, "response_len_mean")))
    return ([x for x in xs if x in responses],
            [p + responses[x] for x, p in zip(xs, prompts) if x in responses])


@dataclasses.dataclass
class PlotPanels:
    """What one figure shows of its series (key -> (steps, values)):

    - `drawn`: the series that get a line (a panel of their own in one-axes-per-key figures);
    - `constant`: in those figures, series that never change (key -> value): named in the title
      instead of a flat panel, unless every series is constant (then they are drawn);
    - `same_as`: a series equal to an earlier one (key -> that key; `accuracy` is `reward_mean`
      under 0/1 rewards): not drawn again under it, the earlier line's label names both
      (`reward_mean = accuracy`). Lines that differ get different line styles and markers."""
    drawn: dict[str, tuple[list, list]]
    constant: dict[str, float]
    same_as: dict[str, str]


def plot_panels(series: dict[str, tuple[list, list]], separate: bool) -> PlotPanels:
    constant = {k: ys[0] for k, (_, ys) in series.items()
                if separate and len(ys) > 1 and min(ys) == max(ys)}
    if len(constant) == len(series):
        constant = {}
    kept = {k: s for k, s in series.items() if k not in constant}
    same_as: dict[str, str] = {}
    for i, (key, s) in enumerate(kept.items()):
        earlier = [k for k in list(kept)[:i] if kept[k] == s and k not in same_as]
        if earlier and not separate:
            same_as[key] = earlier[0]
    drawn = {k: s for k, s in kept.items() if k not in same_as}
    return PlotPanels(drawn, constant, same_as)


_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "x"))  # line, marker: told apart in grey too


def _line_label(key: str, panels: PlotPanels) -> str:
    names = " = ".join([key, *(k for k, first in panels.same_as.items() if first == key)])
    return f"{names} (GiB)" if "bytes" in key else names


def _constant_note(panels: PlotPanels) -> str:
    import textwrap

    if not panels.constant:
        return ""
    items = ", ".join(f"{k} = {v / 2**30:.3g} GiB" if "bytes" in k else f"{k} = {v:.6g}"
                      for k, v in panels.constant.items())
    return "\n" + textwrap.fill(f"constant, not drawn: {items}", 90)


def _legend_outside(ax, fontsize: int = 8) -> None:
    """Beside the axes, not over the lines (savefig's tight box keeps it in the image)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _draw_figure(plt, rows: list[dict], title: str, panels: PlotPanels, separate: bool):
    n_axes = len(panels.drawn) if separate else 1
    fig, axes = plt.subplots(n_axes, 1, figsize=(7, 2.2 + 1.6 * n_axes), sharex=True, squeeze=False)
    for i, (key, (xs, ys)) in enumerate(panels.drawn.items()):
        ax = axes[i if separate else 0][0]
        if "bytes" in key:  # KV sizes read better in GiB than as 1e10
            ys = [y / 2**30 for y in ys]
        line, marker = _STYLES[i % len(_STYLES)]
        ax.plot(xs, ys, linestyle=line, marker=marker if len(xs) < 30 else None, markersize=3,
                label=_line_label(key, panels))
        if key == "kv_peak_slots_per_sample":  # what the same samples would hold dense
            ax.plot(*dense_kv_slots(rows), linestyle="--", color="gray",
                    label="dense: prompt + response tokens")
            _legend_outside(ax, 7)
        if separate:
            ax.set_ylabel(_line_label(key, panels), fontsize=8)
    for (ax,) in axes:
        ax.grid(alpha=0.3)
        if not separate:
            _legend_outside(ax)
    axes[0][0].set_title(title + _constant_note(panels), fontsize=10)
    axes[-1][0].set_xlabel("rollout")
    return fig


def plot_metrics(jsonl_path, out_dir=None) -> list[Path]:
    """Write PNGs of the logged metrics (``out_dir`` defaults to the JSONL's folder); plots
    whose keys never appear are skipped. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    rows = read_metrics(jsonl_path)
    out = Path(out_dir) if out_dir is not None else Path(jsonl_path).parent
    out.mkdir(parents=True, exist_ok=True)
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k != "step" and k not in keys)
    written = []
    for file_name, title, wanted, separate in _PLOTS:
        series = {k: key_series(rows, k) for k in keys if wanted(k)}
        series = {k: s for k, s in series.items() if s[0]}
        if not series:
            continue
        fig = _draw_figure(plt, rows, title, plot_panels(series, separate), separate)
        path = out / file_name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
