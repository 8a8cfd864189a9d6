"""``summary.md`` of a ``multiturn_lane.sh`` output folder (issue 66 item 2: why a multi-turn
continuation prefill step costs ~134 ms on an H200).

    python -m benchmarks.studies.multiturn_lane_summary OUT_DIR

Sections: torch's SDPA at changing shapes, cuDNN on and off (prefill_sdpa.json); continuation
against fresh prefill steps as the held context grows (continuation.json); the multi-turn
benchmark per cuDNN setting, where its continuation prefill steps' time goes, and the
profiles' top ops (multiturn.json, mt_profile/). A piece that did not write its JSON shows the
last lines of its log instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.engine.multiturn_probe import one_look as step_look
from benchmarks.engine.multiturn_profile import one_look as profile_look


def load(out: Path, name: str):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def missing(out: Path, name: str) -> list[str]:
    log = out / f"{name}.log"
    tail = log.read_text().splitlines()[-8:] if log.exists() else ["(no log)"]
    return [f"{name}: no JSON; the end of {log.name}:", "```", *tail, "```"]


def md_table(rows: list[dict], cols: list[str]) -> list[str]:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v))
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            *("| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows)]


def sdpa_section(out: Path) -> list[str]:
    rows = load(out, "prefill_sdpa")
    if rows is None:
        return missing(out, "prefill_sdpa")
    return ["## SDPA at new shapes (prefill_sdpa)", "",
            *md_table(rows, ["cudnn", "call", "backend", "first_ms", "repeat_ms", "first_total_ms"])]


def continuation_section(out: Path) -> list[str]:
    data = load(out, "continuation")
    if data is None:
        return missing(out, "continuation")
    cols = list(data["rows"][0]) if data["rows"] else []
    lines = ["## Continuation against fresh prefill, held context growing (continuation_prefill)",
             "", *md_table(data["rows"], cols), ""]
    for name, tables in (data.get("profile") or {}).items():
        for kind in ("continuation", "fresh"):
            lines.append(f"- profile cp_profile/{name}/: {profile_look(tables, kind)}")
    return lines


MULTI = ["mode", "cudnn_sdp", "tokens_per_s", "wall_s", "decode_steps", "decode_s",
         "outside_decode_s", "prefill_steps", "prefill_s", "commands", "close_calls", "tool_s"]


def multiturn_section(out: Path) -> list[str]:
    data = load(out, "multiturn")
    if data is None:
        return missing(out, "multiturn")
    lines = ["## Multi-turn against single-turn, cuDNN attention off / on", "",
             *md_table(data["rows"], MULTI), ""]
    for setting, s in data["summary"].items():
        lines.append(f"- cudnn_sdp {setting}: multi/single tokens/s "
                     f"**{s['multi_over_single_tokens_per_s']:.2f}** (target >= 0.50), "
                     f"barrier gone {s['barrier_gone']}")
    for r in data["rows"]:
        if r["mode"] == "multi-turn":
            lines.append(f"- cudnn_sdp {r['cudnn_sdp']}: {step_look(r)}")
    for setting, p in data.get("profiles", {}).items():
        text = p["error"] if "error" in p else profile_look(p["tables"])
        lines.append(f"- profile cudnn_sdp {setting} (mt_profile/cudnn_{setting}/): {text}")
    return lines


def write(out: Path) -> Path:
    lines = ["# Multi-turn lane (issue 66 item 2)", ""]
    for section in (sdpa_section, continuation_section, multiturn_section):
        lines += section(out) + [""]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the lane's output folder")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        p.error(f"OUT_DIR {out} is not a folder")
    print(write(out).read_text())


if __name__ == "__main__":
    main()
