"""Decode GEMMs: cuBLAS (F.linear, + fused_ops.silu_mul for the MLP) against triton_gemm's
picked tile and, with --sweep, every tile of a small grid; each timed as 24 back-to-back calls
replayed in a CUDA graph (what a graphed decode step pays, kernel boundaries included), each
call on its own copy of the weights, as a model's 24 layers are: the weights come from HBM, not
from the 50 MB L2 that one matrix reused 24 times would sit in.

    PYTHONPATH=sglang-kvc:. python benchmarks/bench_gemm.py [--shape qwen2.5-0.5b] [--m 64 256]
        [--sweep] [--lm-head]

Columns: microseconds per call (median of 5 replays), the weights' bytes over that time (TB/s),
and the max |difference| to cuBLAS relative to cuBLAS' max |value|.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
import torch.nn.functional as F

from sglang_kvc import triton_gemm
from sglang_kvc.fused_ops import row_argmax, silu_mul
from sglang_kvc.triton_gemm import GemmConfig

# hidden, intermediate, q size, kv size, vocab
SHAPES = {
    "smollm2-135m": (576, 1536, 576, 192, 49152),
    "qwen2.5-0.5b": (896, 4864, 896, 128, 151936),
    "qwen2.5-1.5b": (1536, 8960, 1536, 256, 151936),
    "qwen2.5-3b": (2048, 11008, 2048, 256, 151936),
}


def layer_ops(shape: str, lm_head: bool) -> list[tuple[str, int, int, bool, bool]]:
    """(name, output columns, K, fused silu*mul, bias) of a decoder layer's GEMMs."""
    h, inter, q, kv, vocab = SHAPES[shape]
    ops = [("qkv", q + 2 * kv, h, False, True), ("o_proj", h, q, False, False),
           ("gate_up+silu", inter, h, True, False), ("down", h, inter, False, False)]
    return ops + ([("lm_head", vocab, h, False, False)] if lm_head else [])


def graph_us(fn, calls: int, repeats: int = 5) -> float:
    """fn(i) for i < calls, captured once, replayed `repeats` times: median us per call."""
    fn(0)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def sweep_configs(m: int, k: int, fused: bool):
    """A pruned grid: whole-M or half-M tiles, K splits only where K is long."""
    bms = [b for b in (16, 32, 64, 128) if b <= max(16, m)][-2:]
    splits = [s for s in (1, 2, 4, 8) if k // s >= 512]
    for bm, bn, bk, split in itertools.product(bms, (32, 64, 128), (64, 128), splits):
        tile_kb = (bm * bk + (2 if fused else 1) * bk * bn) * 2 / 1024
        for stages in (3, 4):
            if stages * tile_kb <= 160:
                yield GemmConfig(bm, bn, bk, split, 4 if bm * bn <= 64 * 64 else 8, stages)


def timed(label, fn, calls, cfg=None):
    try:
        return (label, graph_us(fn, calls), cfg)
    except Exception as exc:  # e.g. the tile needs more shared memory than the SM has
        print(f"    {label}: {type(exc).__name__}", flush=True)
        return None


def run_op(name, n, k, fused, bias, m, sweep, budget_s, copies):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    ws = [(torch.randn(n * (2 if fused else 1), k, device="cuda", generator=g) / k ** 0.5).bfloat16()
          for _ in range(copies)]
    b = torch.randn(ws[0].shape[0], device="cuda", generator=g).bfloat16() if bias else None
    if fused:
        def base_fn(i):
            return silu_mul(F.linear(x, ws[i], b))
    else:
        def base_fn(i):
            return F.linear(x, ws[i], b)
    ref = base_fn(0).float()
    tri = triton_gemm.linear_silu_mul if fused else triton_gemm.linear
    picked = triton_gemm.pick_config(m, n, k, fused)
    rows = [timed("cuBLAS", base_fn, copies),
            timed(f"picked {fmt(picked)}", lambda i: tri(x, ws[i], b, picked), copies, picked)]
    if sweep:
        t0, swept = time.time(), []
        for cfg in sweep_configs(m, k, fused):
            if time.time() - t0 > budget_s:
                print("    (sweep budget spent)", flush=True)
                break
            swept.append(timed(f"sweep {fmt(cfg)}", lambda i, c=cfg: tri(x, ws[i], b, c), copies, cfg))
        rows += sorted((r for r in swept if r), key=lambda r: r[1])[:3]
    rows = [r for r in rows if r]
    nbytes = ws[0].numel() * 2
    for label, us, cfg in rows:
        err = ""
        if cfg is not None:
            e = (tri(x, ws[0], b, cfg).float() - ref).abs().max().item() / ref.abs().max().item()
            err = f"  x{rows[0][1] / us:4.2f}  rel.diff {e:.1e}"
        print(f"  {name:13s} M={m:4d}  {label:44s} {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s{err}", flush=True)
    return rows


def run_argmax(m: int, vocab: int) -> None:
    """The greedy step after the LM head: torch's argmax vs fused_ops.row_argmax on bf16 logits."""
    logits = [torch.randn(m, vocab, device="cuda").bfloat16() for _ in range(2)]
    nbytes = logits[0].numel() * 2
    same = torch.equal(row_argmax(logits[0]), logits[0].argmax(dim=-1))
    for label, fn in (("torch argmax", lambda i: logits[i % 2].argmax(dim=-1)),
                      ("row_argmax (Triton)", lambda i: row_argmax(logits[i % 2]))):
        us = graph_us(fn, 24)
        print(f"  {'argmax':13s} M={m:4d}  {label:44s} {us:8.2f} us  {nbytes / us / 1e6:5.2f} TB/s"
              f"  same ids: {same}", flush=True)


def fmt(c: GemmConfig) -> str:
    return f"bm{c.block_m} bn{c.block_n} bk{c.block_k} s{c.split_k} w{c.num_warps} st{c.num_stages}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(SHAPES))
    ap.add_argument("--m", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--lm-head", action="store_true")
    ap.add_argument("--budget-s", type=float, default=60.0, help="sweep time per op and M")
    ap.add_argument("--copies", type=int, default=24, help="weight copies cycled (layers)")
    ap.add_argument("--blas", choices=["default", "cublas", "cublaslt"], default="default",
                    help="torch.backends.cuda.preferred_blas_library for the cuBLAS rows")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm needs a CUDA device")
    print(f"device: {torch.cuda.get_device_name()}; bf16; us per call in a graph of {args.copies} calls",
          flush=True)
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    totals = {}
    for shape in args.shape:
        for m in args.m:
            print(f"{shape}, M = {m}", flush=True)
            for op in layer_ops(shape, args.lm_head):
                is_head = op[0] == "lm_head"  # 136+ MB: larger than L2 already
                rows = run_op(*op, m, args.sweep and not is_head, args.budget_s, 2 if is_head else args.copies)
                for label, (_, us, _) in zip(("cuBLAS", "picked", "best"), rows):
                    key = (shape, m, label)
                    totals[key] = totals.get(key, 0.0) + (0.0 if is_head else us)
            if args.lm_head:
                run_argmax(m, SHAPES[shape][4])
    print("per-layer sum (us): " + ", ".join(f"{s} M={m} {lab} {v:.1f}" for (s, m, lab), v in totals.items()))


if __name__ == "__main__":
    main()
