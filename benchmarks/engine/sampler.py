"""Sampler on its own: the torch path against the fused Triton kernels (layers/sampling_kernels.py)
for the RL decode step: every row sampled at T = 1 by inverse CDF, with the sampled token's log-prob
over the full vocabulary, bf16 logits of the Qwen vocabulary (V = 151,936).

Each timing is one Sampler call captured in a CUDA graph (as engine/cuda_graph.py runs it) and
replayed; min / median / max over the repeats, in microseconds. Before each replay the L2 cache is
overwritten (--no-flush keeps it warm: at B = 64 the logits fit in an H100's 50 MB L2). Also
printed: the fraction of ids both paths agree on (they may differ only where u * total lies within
float rounding of a CDF boundary).

    python -m benchmarks.engine.sampler [--batches 64 256] [--vocab 151936] [--repeats 20]

Internals timed (a component micro-benchmark, tests/test_layout.py): `sglang_kvc.engine.sampler`'s
`Sampler` on a `SamplingBatch`, without an engine.
"""

from __future__ import annotations

import argparse
import statistics

import torch


from sglang_kvc.engine import sampler as sampler_mod
from sglang_kvc.engine.sampler import Sampler, SamplingBatch


def sampling_batch(B: int) -> SamplingBatch:
    dev = "cuda"
    t = torch.ones(B, device=dev)
    return SamplingBatch(
        temperatures=t, top_p=torch.ones(B, device=dev), top_k=torch.full((B,), 1 << 30, device=dev),
        min_p=torch.zeros(B, device=dev), seeds=torch.arange(B, device=dev) * 7919,
        steps=torch.zeros(B, dtype=torch.int64, device=dev), all_greedy=False, need_filter=False,
        need_logprobs=True, top_logprobs_num=0, divisors=t, sampled=t > 0)


def captured(fused: bool, logits: torch.Tensor, sb: SamplingBatch):
    """(graph, output) of one Sampler call on the chosen path."""
    saved = sampler_mod.fused_sampling_enabled
    if not fused:
        sampler_mod.fused_sampling_enabled = lambda x: False
    try:
        sampler = Sampler()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            sampler(logits, sb)  # compile / warm up outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sampler(logits, sb)
    finally:
        sampler_mod.fused_sampling_enabled = saved
    return graph, out


def time_us(graph, repeats: int, flush: torch.Tensor | None) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-flush", action="store_true", help="keep the L2 cache warm between replays")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks.engine.sampler: no CUDA device here; nothing to measure (the fused kernels run on CUDA).")
        return
    flush = None if a.no_flush else torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}, V = {a.vocab}, bf16 logits, T = 1, log-probs on, "
          f"{a.repeats} graph replays, L2 {'warm' if a.no_flush else 'flushed'} (us)")
    print(f"{'B':>5} {'path':>6} {'min':>9} {'median':>9} {'max':>9}")
    for B in a.batches:
        g = torch.Generator(device="cuda").manual_seed(B)
        logits = (torch.randn(B, a.vocab, device="cuda", generator=g) * 3).bfloat16()
        sb = sampling_batch(B)
        ids, lps = {}, {}
        for name, fused in (("torch", False), ("fused", True)):
            graph, out = captured(fused, logits, sb)
            t = time_us(graph, a.repeats, flush)
            print(f"{B:>5} {name:>6} {min(t):>9.1f} {statistics.median(t):>9.1f} {max(t):>9.1f}")
            ids[name], lps[name] = out.ids.clone(), out.logprobs.clone()
            del graph, out
        same = ids["torch"] == ids["fused"]
        lp = (lps["torch"] - lps["fused"])[same].abs().max().item()
        print(f"{B:>5} ids equal on {same.float().mean().item():.4f} of rows; "
              f"max |logprob diff| where equal {lp:.2e}")


if __name__ == "__main__":
    main()
