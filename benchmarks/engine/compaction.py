"""One compaction round on its own: the GPU time `Compressor.compress` takes for R requests that
all hold n = budget + divide length slots, per algorithm, split into its stages.

This is what a compressing engine pays every `--divide-length` decode steps on top of dense
decoding (compression.py measures the whole effect). Qwen2.5-0.5B shape by default
(24 layers, 2 KV heads, 14 query heads, head dim 64), random bf16 keys/values and queries.

    stages: gather (held keys + ring queries), score (the policy), select (sort + window),
            compact (move kept K/V, free the rest, and with --eviction-record update the
            requests' records); `total` is compress() end to end on the GPU, `host` the host's
            time to issue it (no sync: on a GPU, what the decode loop waits before its next step)

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.compaction [--requests 256] [--repeats 5]

Internals timed (a component micro-benchmark, tests/test_layout.py): `sglang_kvc.compression`'s
`Compressor`, `QueryRing`, `Trigger` and `kvcache.kv_cache`'s `KVCache` / `KVPool`, without an
engine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from sglang_kvc.compression import CompressionConfig
from sglang_kvc.compression.compressor import Compressor
from sglang_kvc.compression.eviction_record import EvictionTracker
from sglang_kvc.compression.query_ring import QueryRing
from sglang_kvc.compression.trigger import Trigger
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool


def make_round(args, algo: str, device: torch.device):
    """A KV cache whose R requests each hold n slots, and the compressor to compact them."""
    cfg = CompressionConfig(algorithm=algo, budget=args.budget, divide_length=args.divide_length)
    n, R = cfg.capacity, args.requests
    pool = KVPool(R * n + 1, args.layers, args.kv_heads, args.head_dim, torch.bfloat16, device)
    kv = KVCache(pool, R, n)
    ring = QueryRing(args.layers, R + 1, cfg.window, args.heads, args.head_dim, torch.bfloat16, device)
    g = torch.Generator(device=device).manual_seed(0)
    for buf in (pool.k, pool.v, ring.buf):
        buf.copy_(torch.randn(buf.shape, generator=g, device=device, dtype=torch.float32))
    comp = Compressor(cfg, kv, ring, Trigger(cfg))
    return comp, kv, n


def fresh_seqs(kv: KVCache, R: int, n: int, records: bool = False) -> list:
    """R requests holding n slots each (slots handed out in a shuffled order, as in a real pool),
    each with an eviction record when `records` (what replay's rollouts ask for)."""
    kv.reset()
    L, _, hkv, _ = kv.pool.shape
    # what Compressor.compress and Trigger read of a request (a per-request budget, none pinned)
    seqs = [SimpleNamespace(row=None, prefix_len=0, kv_len=0, peak_kv=0, num_compressions=0,
                            tokens_evicted=0, compress_budget=None, first_prompt_len=None,
                            prompt_ids=[0], num_computed=n,
                            eviction=EvictionTracker(L, hkv) if records else None) for _ in range(R)]
    for s in seqs:
        kv.attach(s)
    kv.allocator.free_slots = kv.allocator.free_slots[torch.randperm(kv.capacity, device=kv.pool.device)]
    kv.extend(seqs, [n] * R)
    return seqs


class StageTimer:
    """CUDA-event (or wall-clock on CPU) time of each stage of one compress() call."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.host_ms = 0.0  # compress()'s host time, set by timed_compress
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))
        else:
            self.marks.append((name, time.perf_counter()))

    def stages(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


def timed_compress(comp: Compressor, seqs: list, timer: StageTimer) -> None:
    """compress(), with a timer mark after each stage (same code path, stages made visible)."""
    policy, kv = comp.policy, comp.kv
    orig_score, orig_compact = policy.score, kv.compact

    def score(keys, queries):
        timer.mark("gather")
        s = orig_score(keys, queries)
        timer.mark("score")
        return s

    def compact(*a, **kw):
        timer.mark("select")
        orig_compact(*a, **kw)
        timer.mark("compact")

    policy.score, kv.compact = score, compact
    try:
        timer.mark("start")
        start = time.perf_counter()
        comp.compress(seqs)
        timer.host_ms = 1e3 * (time.perf_counter() - start)
        timer.mark("total_end")
    finally:
        policy.score, kv.compact = orig_score, orig_compact


def bench(args, algo: str, device: torch.device) -> dict[str, list[float]]:
    comp, kv, n = make_round(args, algo, device)
    per_stage: dict[str, list[float]] = {}
    for i in range(args.warmup + args.repeats):
        seqs = fresh_seqs(kv, args.requests, n, args.eviction_record)
        if device.type == "cuda":
            torch.cuda.synchronize()
        timer = StageTimer(device)
        timed_compress(comp, seqs, timer)
        st = timer.stages()
        st["total"] = sum(v for k, v in st.items() if k != "total_end") + st.pop("total_end")
        st["host"] = timer.host_ms
        if i >= args.warmup:
            for k, v in st.items():
                per_stage.setdefault(k, []).append(v)
    return per_stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--divide-length", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--algorithms", default="rkv,snapkv,streamingllm")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--eviction-record", action="store_true",
                    help="every request keeps an eviction record (replay's rollouts)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}: {args.requests} requests x {args.budget + args.divide_length} slots -> "
          f"{args.budget}, {args.layers} layers, {args.kv_heads} KV heads, head dim {args.head_dim}")
    print("| algorithm | stage | ms min / median / max |\n|---|---|---|")
    for algo in args.algorithms.split(","):
        for stage, v in bench(args, algo, device).items():
            print(f"| {algo} | {stage} | {min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
