"""Paged decode attention (triton_decode.py) on its own: microseconds per layer and the K/V bytes
read per second, for a batch of requests at a given context, per launch setting.

The default row is the engine's setting before KV-head blocks (one KV head per program, 2
splits at batch 256). Each timing is a CUDA graph of one call per layer (24 layers, each its own
K/V pool, so the reads come from HBM as in a decode step), replayed 5 times (median). Slots are
handed out in a shuffled order (`--layout random`), as in a pool that has served requests for a
while.

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.decode_attention [--batch 256]
        [--contexts 140 384 640] [--sweep]

Internals timed (a component micro-benchmark, tests/test_layout.py): `sglang_kvc.layers`'
`triton_decode.paged_decode_attention` and `fused_ops.rope_store_`, without an engine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch


DEFAULT = dict(num_splits=2, block_n=64, num_warps=4, num_stages=2, kv_per_program=1)


def slot_table(layout: str, B: int, ctx: int) -> torch.Tensor:
    """[B, ctx] slots (slot 0 reserved). random: a shuffled pool; interleaved: what one slot per
    request per step from a sorted free list gives (request i's t-th slot = 1 + t*B + i);
    contiguous: each request's slots in one run."""
    if layout == "random":
        flat = torch.randperm(B * ctx, device="cuda") + 1
        return flat.view(B, ctx).to(torch.int32)
    grid = torch.arange(B * ctx, device="cuda").view(ctx, B).t() if layout == "interleaved" \
        else torch.arange(B * ctx, device="cuda").view(B, ctx)
    return (grid + 1).to(torch.int32).contiguous()


def make_layers(args, ctx):
    B, L = args.batch, args.layers
    slots = B * ctx + 1
    k = [torch.randn(slots, args.kv_heads, args.head_dim, device="cuda").bfloat16() for _ in range(L)]
    v = [torch.randn(slots, args.kv_heads, args.head_dim, device="cuda").bfloat16() for _ in range(L)]
    table = slot_table(args.layout, B, ctx)
    rows = torch.arange(B, device="cuda")
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(B, args.heads, args.head_dim, device="cuda").bfloat16()
    return q, k, v, table, rows, lens


def graph_us(call, layers: int, repeats: int = 5) -> float:
    call(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(layers):
            call(i)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / layers)
    return statistics.median(times)


def settings(sweep: bool, given: str | None = None):
    if given:
        yield from json.loads(given)
        return
    yield dict(DEFAULT)
    if not sweep:
        return
    for splits, bn, warps, stages, kvb in itertools.product(
            (1, 2, 4, 8), (32, 64), (2, 4, 8), (1, 2, 3), (1, 2)):
        s = dict(num_splits=splits, block_n=bn, num_warps=warps, num_stages=stages, kv_per_program=kvb)
        if s != DEFAULT:
            yield s


def run_context(args, ctx: int, results: dict) -> None:
    from sglang_kvc.layers.triton_decode import paged_decode_attention  # Triton: after --help
    q, k, v, table, rows, lens = make_layers(args, ctx)
    nbytes = 2 * args.batch * ctx * args.kv_heads * args.head_dim * 2
    ref = paged_decode_attention(q, k[0], v[0], table, rows, lens, 0.125, **DEFAULT).float()
    for s in settings(args.sweep, args.settings):
        try:
            us = graph_us(lambda i, s=s: paged_decode_attention(q, k[i], v[i], table, rows, lens, 0.125, **s),
                          args.layers)
            err = (paged_decode_attention(q, k[0], v[0], table, rows, lens, 0.125, **s).float() - ref).abs().max()
        except Exception as exc:  # a setting the compiler or the SM cannot take
            print(f"  ctx {ctx} {s}: {type(exc).__name__}", flush=True)
            continue
        results.setdefault(tuple(sorted(s.items())), {})[ctx] = (us, nbytes / us / 1e6, err.item())


def run_rope(args, ctx: int) -> None:
    """A layer's RoPE + K/V store + attention as the engine runs it: the separate rope_store_
    kernel then the kernel, vs the kernel doing all three (NewTokenKV); picked settings."""
    from sglang_kvc.layers.fused_ops import rope_store_
    from sglang_kvc.layers.triton_decode import NewTokenKV, paged_decode_attention

    q, k, v, table, rows, lens = make_layers(args, ctx)
    B, hq, hkv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    qkv = torch.randn(B, (hq + 2 * hkv) * d, device="cuda").bfloat16()
    qs, ks, vs = (t.view(B, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    pos = lens.long() - 1
    freqs = torch.arange(ctx, device="cuda").float()[:, None] * torch.rand(d // 2, device="cuda")[None, :]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    slots = table[rows, pos].long()

    def separate(i):
        qr = rope_store_(qs, ks, vs, pos, cos, sin, k[i], v[i], slots,
                         q_out=torch.empty(qs.shape, dtype=qs.dtype, device="cuda"))
        return paged_decode_attention(qr, k[i], v[i], table, rows, lens, 0.125)

    def fused(i):
        new = NewTokenKV(ks, vs, pos, cos, sin, slots)
        return paged_decode_attention(qs, k[i], v[i], table, rows, lens, 0.125, new=new)

    for name, call in (("rope_store_ + attention", separate), ("fused (NewTokenKV)", fused)):
        times = [graph_us(call, args.layers) for _ in range(args.rope_repeats)]
        print(f"ctx {ctx} {name}: us per layer min/median/max "
              f"{min(times):.2f} / {statistics.median(times):.2f} / {max(times):.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--contexts", type=int, nargs="+", default=[140, 384, 640])
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--layout", choices=["random", "interleaved", "contiguous"], default="random")
    ap.add_argument("--settings", default=None,
                    help="JSON list of settings to time instead of the default / the sweep")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--rope", action="store_true",
                    help="time RoPE + store + attention: separate kernels vs fused")
    ap.add_argument("--rope-repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: B={args.batch}, heads {args.heads}/{args.kv_heads}, "
          f"D={args.head_dim}, bf16, slots {args.layout}", flush=True)
    if args.rope:
        for ctx in args.contexts:
            run_rope(args, ctx)
        return
    results = {}
    for ctx in args.contexts:
        run_context(args, ctx, results)
        torch.cuda.empty_cache()
    total = {key: sum(r[0] for r in per.values()) for key, per in results.items() if len(per) == len(args.contexts)}
    ranked = sorted(total, key=total.get)
    default_key = tuple(sorted(DEFAULT.items()))
    print("setting | " + " | ".join(f"ctx {c}: us (TB/s)" for c in args.contexts) + " | max |diff| vs default")
    first = [default_key] if default_key in total else []
    for key in (first + [k for k in ranked if k != default_key][:args.top]):
        per = results[key]
        cells = " | ".join(f"{per[c][0]:.2f} ({per[c][1]:.2f})" for c in args.contexts)
        print(f"{dict(key)} | {cells} | {max(r[2] for r in per.values()):.1e}", flush=True)


if __name__ == "__main__":
    main()
