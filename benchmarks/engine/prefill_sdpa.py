"""Prefill attention at shapes that change from step to step, with torch's cuDNN attention on
(torch's default order) and off (what the engine's attention does, sglang_kvc/layers/attention.py).

A multi-turn continuation prefill is a few session turns, each some new tokens after its held
KV: two SDPA calls a layer, a causal one over the new tokens [B, H, Lq] and a masked one of the
new tokens over [held | new] [E, H, Lq, Lk], at a new (B, Lq, Lk) almost every step. cuDNN
attention builds and caches one execution graph per shape, so each new shape costs a build.

Printed per setting and call: the backend torch picks (``torch._fused_sdp_choice``), the first
call's milliseconds at each of ``--shapes`` new shapes (median, host and device, synchronized),
and a repeat call's at the same shapes. SmolLM2-135M's heads by default (9 query, 3 KV, 64).

    python -m benchmarks.engine.prefill_sdpa                # CUDA when there is one
    python -m benchmarks.engine.prefill_sdpa --device cpu --shapes 3   # smoke

Internals timed (a component micro-benchmark, tests/test_layout.py): torch's SDPA at the
engine's prefill shapes, with `sglang_kvc.layers.attention.expand_kv_heads` making the
masked call as the engine does on CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from sglang_kvc.layers.attention import expand_kv_heads


def step_shapes(n: int, seed: int) -> list[tuple[int, int, int]]:
    """n distinct (rows, new tokens, held + new) of continuation prefills."""
    g = torch.Generator().manual_seed(seed)
    seen: set[tuple[int, int, int]] = set()
    while len(seen) < n:
        b, lq, held = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in
                       ((2, 16), (40, 100), (80, 300)))
        seen.add((b, lq, held + lq))
    return sorted(seen)


def inputs(shape, heads, kv_heads, dim, dtype, device):
    b, lq, lk = shape
    q = torch.randn(b, heads, lq, dim, dtype=dtype, device=device)
    k, v = (torch.randn(b, kv_heads, lk, dim, dtype=dtype, device=device) for _ in range(2))
    pos = torch.arange(lk - lq, lk, device=device)
    mask = (torch.arange(lk, device=device)[None, :] <= pos[:, None])[None, None].expand(b, 1, lq, lk)
    return q, k, v, mask


def calls(q, k, v, mask):
    """The two calls of a layer: causal over the new tokens, masked over held + new; and the
    masked one as the engine makes it on CUDA now, K/V expanded to the query heads
    (attention.expand_kv_heads: the memory-efficient kernel takes masks, not grouped heads),
    the expansion's copies timed with it."""
    lq, h = q.shape[2], q.shape[1]
    return {"causal": lambda: F.scaled_dot_product_attention(
                q, k[:, :, -lq:], v[:, :, -lq:], is_causal=True, enable_gqa=True),
            "masked": lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True),
            "masked_expanded": lambda: F.scaled_dot_product_attention(
                q, expand_kv_heads(k, h), expand_kv_heads(v, h), attn_mask=mask)}


def backend_of(name, q, k, v, mask) -> str:
    lq, gqa = q.shape[2], name != "masked_expanded"
    if not gqa:
        k, v = expand_kv_heads(k, q.shape[1]), expand_kv_heads(v, q.shape[1])
    args = (q, k[:, :, -lq:], v[:, :, -lq:], None, 0.0, True) if name == "causal" \
        else (q, k, v, mask, 0.0, False)
    try:
        return SDPBackend(torch._fused_sdp_choice(*args, enable_gqa=gqa)).name
    except Exception as e:  # noqa: BLE001 - a private helper: print why instead of failing
        return f"? ({type(e).__name__})"


def timed_ms(fn, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def run_setting(cudnn: bool, shapes, args, device) -> list[dict]:
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    rows = []
    try:
        for name in ("causal", "masked", "masked_expanded"):
            first, again, picked = [], [], set()
            for shape in shapes:
                x = inputs(shape, args.heads, args.kv_heads, args.head_dim, args.dtype, device)
                fn = calls(*x)[name]
                picked.add(backend_of(name, *x))
                first.append(timed_ms(fn, device))
                again.append(timed_ms(fn, device))
            rows.append({"cudnn": cudnn, "call": name, "backend": ",".join(sorted(picked)),
                         "first_ms": statistics.median(first), "repeat_ms": statistics.median(again),
                         "first_total_ms": sum(first)})
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--shapes", type=int, default=24, help="distinct step shapes per setting")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    if args.shapes < 1:
        p.error("--shapes must be at least 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    # warm-up: the kernels' own first-use costs, at a shape the timed ones do not use
    run_setting(False, [(1, 8, 16)], args, device)
    # each setting gets its own shapes: cuDNN's graph cache would otherwise be warm
    rows = run_setting(True, step_shapes(args.shapes, args.seed), args, device)
    rows += run_setting(False, step_shapes(args.shapes, args.seed + 1), args, device)
    print(f"device {device}, torch {torch.__version__}, {args.shapes} new shapes per setting")
    print(f"{'cudnn':>6} {'call':>15} {'backend':>22} {'first_ms':>9} {'repeat_ms':>9} {'first_total_ms':>14}")
    for r in rows:
        print(f"{str(r['cudnn']):>6} {r['call']:>15} {r['backend']:>22} {r['first_ms']:9.3f} "
              f"{r['repeat_ms']:9.3f} {r['first_total_ms']:14.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
