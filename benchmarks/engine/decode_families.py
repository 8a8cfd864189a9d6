"""Where a decode step's GPU time goes: the profiled kernels grouped by family, per step, beside
the floor each family has at the HBM bandwidth (issue 68: decode at 26% of the roofline; this
says which kernels stand between the step and 50%).

Floors: the GEMMs read every weight once a step (W bytes, a tied embedding as the LM head), the
attention reads the K/V slots the batch holds in the profiled steps (their mean count x k bytes,
throughput.roofline's k: with compression, fewer than the context); the other families read activations only, whose bytes are small at decode, so they have no
floor here. A family's "x floor" is its time over that floor (1.0: at the bandwidth).
"""

from __future__ import annotations

import re

# Checked in order: the first pattern matching a kernel's name names its family.
FAMILIES = (("attention", r"_stage1|_stage2|_extend|flash|fmha|attention"),
            ("sampling", r"_chunk_stats|_draw|argmax|uniform|sampl|softmax"),
            ("gemm", r"gemm|cutlass|cublas|nvjet|sm90_xmma|matmul"),
            ("norm", r"rmsnorm"),
            ("activation", r"silu"),
            ("rope_store", r"_rope"),
            ("copies", r"memcpy|memset|copy"))


def family_of(kernel: str) -> str:
    return next((name for name, pat in FAMILIES if re.search(pat, kernel, re.I)), "other")


def step_families(events, steps: int) -> dict[str, dict]:
    """{family: {ms (per step), kernels (per step)}} from profiler device events, largest first."""
    out: dict[str, dict] = {}
    for e in events:
        fam = out.setdefault(family_of(e.name), {"ms": 0.0, "kernels": 0.0})
        fam["ms"] += e.device_time / 1e3 / steps
        fam["kernels"] += 1 / steps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


def floors_ms(weight_bytes: float, kv_bytes: float, bandwidth: float) -> dict[str, float]:
    """Each family's floor in ms at `bandwidth` bytes/s (families not named: none)."""
    return {"gemm": 1e3 * weight_bytes / bandwidth, "attention": 1e3 * kv_bytes / bandwidth}


def family_table(families: dict[str, dict], floors: dict[str, float]) -> str:
    """A markdown table: family, ms per step, share, kernels per step, floor, x floor."""
    total = sum(f["ms"] for f in families.values()) or float("nan")
    rows = ["| family | ms / step | share | kernels / step | floor ms | x floor |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, f in families.items():
        floor = floors.get(name)
        ratio = f"{f['ms'] / floor:.1f}" if floor else "-"
        rows.append(f"| {name} | {f['ms']:.3f} | {100 * f['ms'] / total:.0f}% | {f['kernels']:.0f} "
                    f"| {'-' if floor is None else f'{floor:.3f}'} | {ratio} |")
    rows.append(f"| all | {total:.3f} | 100% | {sum(f['kernels'] for f in families.values()):.0f} "
                f"| {sum(floors.values()):.3f} | {total / sum(floors.values()):.1f} |")
    return "\n".join(rows)
