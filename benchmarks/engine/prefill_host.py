"""The host's work to lay out one continuation prefill step: milliseconds per call.

A multi-turn rollout's continuation prefill (a few hundred sessions' next turns, ~26 new tokens
each after ~100 held) replays its forward as one CUDA graph (engine/prefill_graph.py), so what
is left of the step on the host is its layout: each token's position and padding layout
(`prefill_layout`), the held-KV layout and the paged kernel's work list (`extend_layout`), the
new slots and their slot-table write (`KVCache.extend`), the token ids' copy (`ints_to_device`). An H200 machine's profile of such steps
(2026-11-29) found 44 torch CPU index calls costing 77 ms over 4 steps: these are numpy now.

    python -m benchmarks.engine.prefill_host                 # CUDA when there is one
    python -m benchmarks.engine.prefill_host --rows 180 --new 26 --held 120 --repeats 50

Internals timed (a component micro-benchmark, tests/test_layout.py): `engine.step_io`'s
`prefill_layout` and `extend_layout`, `kvcache.host_copy.ints_to_device`, `kvcache.kv_cache.KVCache.extend`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sglang_kvc.engine.step_io import extend_layout, prefill_layout
from sglang_kvc.kvcache.host_copy import ints_to_device
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool


class _Row:
    """What KVCache.extend reads of a request: its table row and held slots."""

    def __init__(self, row: int, kv_len: int):
        self.row, self.kv_len = row, kv_len


def shapes(args) -> tuple[list[int], list[int]]:
    """Each row's new tokens (new +- 25%) and held slots (held +- 50%), seeded."""
    g = torch.Generator().manual_seed(args.seed)
    spread = lambda mean, frac: int(mean * (1 + frac * (2 * torch.rand(1, generator=g).item() - 1)))
    return ([max(1, spread(args.new, 0.25)) for _ in range(args.rows)],
            [max(1, spread(args.held, 0.5)) for _ in range(args.rows)])


def timed_ms(fn, device, repeats: int) -> list[float]:
    """Host milliseconds of each call (no sync: the host's work is what is timed), after one
    untimed call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def run(args) -> list[dict]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    counts, held = shapes(args)
    rows = list(range(1, args.rows + 1))
    flat = [7] * sum(counts)
    longest = max(h + n for h, n in zip(held, counts)) + 1
    pool = KVPool(args.rows * longest + 16, 1, 1, 16, torch.bfloat16, device)
    kv = KVCache(pool, max_requests=args.rows, max_len=longest)

    def allocate():
        reqs = [_Row(r, h) for r, h in zip(rows, held)]
        slots = kv.extend(reqs, counts)
        kv.allocator.free(slots)

    calls = {"prefill_layout": lambda: prefill_layout(counts, held, device),
             "extend_layout": lambda: extend_layout(counts, held, rows, device),
             "KVCache.extend": allocate,
             "token_ids": lambda: ints_to_device(flat, device)}  # (the row name of earlier data)
    out = []
    for name, fn in calls.items():
        ms = timed_ms(fn, device, args.repeats)
        out.append({"call": name, "device": str(device), "rows": args.rows, "tokens": sum(counts),
                    "min_ms": min(ms), "median_ms": statistics.median(ms), "max_ms": max(ms)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--rows", type=int, default=150, help="continuing rows in the step")
    p.add_argument("--new", type=int, default=26, help="mean new tokens a row")
    p.add_argument("--held", type=int, default=110, help="mean held slots a row")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    for flag in ("rows", "new", "held", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    rows = run(args)
    print(f"{'call':>16} {'device':>7} {'rows':>5} {'tokens':>7} {'min_ms':>8} {'median_ms':>9} {'max_ms':>8}")
    for r in rows:
        print(f"{r['call']:>16} {r['device']:>7} {r['rows']:>5} {r['tokens']:>7} {r['min_ms']:8.3f} "
              f"{r['median_ms']:9.3f} {r['max_ms']:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
