"""One compaction round on its own: the GPU time `Compressor.compress` takes for R requests that
all hold n = budget + divide length slots, per algorithm, split into its stages.

This is what a compressing engine pays every `--divide-length` decode steps on top of dense
decoding (compression.py measures the whole effect). A second table drives the round as the
engine does (`Compressor.after_step`, which splits it into memory-sized chunks) and prints what
the host pays per event: chunks, torch ops (every aten call, views included), device syncs
(CUDA only: each makes the host wait for the decode step in flight) and host ms. Qwen2.5-0.5B shape by default
(24 layers, 2 KV heads, 14 query heads, head dim 64), random bf16 keys/values and queries.

    stages: gather (held keys + ring queries), score (the policy), select (sort + window),
            compact (move kept K/V, free the rest); `total` is compress() end to end

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.compaction [--requests 256] [--repeats 5]
    (CPU, small: --requests 16 --layers 4 --budget 96 --divide-length 32; the event table
    also says in how many chunks the engine would split the round on CUDA)

Internals timed (a component micro-benchmark, tests/test_layout.py): `sglang_kvc.compression`'s
`Compressor`, `QueryRing`, `Trigger` and `kvcache.kv_cache`'s `KVCache` / `KVPool`, without an
engine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_kvc.compression import CompressionConfig
from sglang_kvc.compression.compressor import Compressor
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


@dataclasses.dataclass(eq=False)  # hashable by identity: the compressor caches per request
class EventSeq:
    """What `Compressor.after_step` and `Trigger` read of a decoding request."""
    row: int | None = None
    prefix_len: int = 0
    kv_len: int = 0
    peak_kv: int = 0
    num_compressions: int = 0
    tokens_evicted: int = 0
    num_computed: int = 0
    prompt_ids: list = dataclasses.field(default_factory=lambda: [0])
    output_ids: list = dataclasses.field(default_factory=lambda: [0])
    first_prompt_len: int | None = None
    compress_budget: int | None = None
    compress_stopped: bool = False
    eviction: object = None


def fresh_seqs(kv: KVCache, R: int, n: int) -> list:
    """R requests holding n slots each (slots handed out in a shuffled order, as in a real pool)."""
    kv.reset()
    seqs = [EventSeq() for _ in range(R)]
    for s in seqs:
        kv.attach(s)
    kv.allocator.free_slots = kv.allocator.free_slots[torch.randperm(kv.capacity, device=kv.pool.device)]
    kv.extend(seqs, [n] * R)
    for s in seqs:
        s.num_computed = n
    return seqs


class StageTimer:
    """CUDA-event (or wall-clock on CPU) time of each stage of one compress() call."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
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
        comp.compress(seqs)
        timer.mark("total_end")
    finally:
        policy.score, kv.compact = orig_score, orig_compact


def bench(args, algo: str, device: torch.device) -> dict[str, list[float]]:
    comp, kv, n = make_round(args, algo, device)
    per_stage: dict[str, list[float]] = {}
    for i in range(args.warmup + args.repeats):
        seqs = fresh_seqs(kv, args.requests, n)
        if device.type == "cuda":
            torch.cuda.synchronize()
        timer = StageTimer(device)
        timed_compress(comp, seqs, timer)
        st = timer.stages()
        st["total"] = sum(v for k, v in st.items() if k != "total_end") + st.pop("total_end")
        if i >= args.warmup:
            for k, v in st.items():
                per_stage.setdefault(k, []).append(v)
    return per_stage


class OpCounter(TorchDispatchMode):
    """Counts aten calls (what the host dispatches: launches, views, allocations)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __enter__(self):
        super().__enter__()
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def event_costs(args, algo: str, device: torch.device) -> dict[str, float]:
    """Host cost of one engine compaction event (`after_step` after a decode step), median over
    the repeats: wall ms of the call without a final sync (on the GPU: the host's share), then
    the same event again under an op counter and (CUDA) a sync counter."""
    from benchmarks.engine.step_probes import count_syncs

    comp, kv, n = make_round(args, algo, device)
    chunks, compress = [], comp.compress
    comp.compress = lambda group: chunks.append(len(group)) or compress(group)

    def event(probe):
        seqs = fresh_seqs(kv, args.requests, n)  # set up outside the probe
        if device.type == "cuda":
            torch.cuda.synchronize()
        chunks.clear()
        with probe as seen:
            t0 = time.perf_counter()
            comp.after_step(seqs, is_prefill=False)
            return (time.perf_counter() - t0) * 1e3, seen

    host, ops, syncs = [], [], []
    for _ in range(args.warmup + args.repeats):
        host.append(event(contextlib.nullcontext())[0])
        ops.append(event(OpCounter())[1].ops)
        if device.type == "cuda":
            syncs.append(event(count_syncs())[1][0])
    tail = slice(args.warmup, None)
    per_chunk_on_cuda = comp.chunk_requests(n, torch.device("cuda"))
    return {"chunks": len(chunks), "cuda_chunks": -(-args.requests // per_chunk_on_cuda),
            "ops": statistics.median(ops[tail]),
            "syncs": statistics.median(syncs[tail]) if syncs else None,
            "host_ms": statistics.median(host[tail])}


def print_events(args, device: torch.device) -> None:
    print("\n| algorithm | chunks / event (here, on CUDA) | torch ops / event | device syncs / event | "
          "host ms / event |\n|---|---:|---:|---:|---:|")
    for algo in args.algorithms.split(","):
        e = event_costs(args, algo, device)
        syncs = "-" if e["syncs"] is None else f"{e['syncs']:.0f}"
        print(f"| {algo} | {e['chunks']} ({e['cuda_chunks']}) | {e['ops']:.0f} | {syncs} | "
              f"{e['host_ms']:.2f} |", flush=True)


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
    ap.add_argument("--events-only", action="store_true",
                    help="only the per-event host table (chunks, ops, syncs, host ms)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}: {args.requests} requests x {args.budget + args.divide_length} slots -> "
          f"{args.budget}, {args.layers} layers, {args.kv_heads} KV heads, head dim {args.head_dim}")
    if not args.events_only:
        print("| algorithm | stage | ms min / median / max |\n|---|---|---|")
        for algo in args.algorithms.split(","):
            for stage, v in bench(args, algo, device).items():
                print(f"| {algo} | {stage} | {min(v):.2f} / {statistics.median(v):.2f} / "
                      f"{max(v):.2f} |", flush=True)
    print_events(args, device)


if __name__ == "__main__":
    main()
