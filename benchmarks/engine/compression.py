"""KV compression at fixed KV memory: concurrency, output tok/s and peak KV bytes, dense vs
rkv / snapkv / streamingllm; and the cost of compression when memory is ample.

Qwen2.5-0.5B shape with random bf16 weights (as throughput.py), `--requests` requests of
`--prompt-len` random token ids generating `--output-len` tokens each (ignore_eos, greedy).
The tight pool holds `--dense-seqs` dense sequences of prompt + output tokens; the ample pool
holds every request densely. Each configuration is a fresh engine in this process, warmed up
(CUDA graphs captured) before the timed run.

    concurrent = requests resident, averaged over wall time (a step's batch size weighted by
                 how long the step took), plus the most running at once
    capacity   = pool slots / the most slots one request can hold (dense: prompt + output;
                 compressed: max(prompt + 1, budget + divide length))
    peak KV bytes = most pool slots ever held x bytes per slot (+ the query ring, when used)

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.compression --json out.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint


def run_config(path: str, prompts: list[list[int]], out_len: int, pool_tokens: int,
               algo: str | None, args) -> dict:
    from sglang_kvc import Engine

    B, P = len(prompts), len(prompts[0])
    kw = {}
    if algo:
        kw = dict(compress_algorithm=algo, compress_max_prompt=args.budget,
                  compress_divide_length=args.divide_length)
    engine = Engine(model_path=path, skip_tokenizer_init=True, dtype="bfloat16",
                    max_total_tokens=pool_tokens, max_running_requests=B, cuda_graph_max_bs=B,
                    context_length=P + out_len + 16, mem_fraction_static=0.9, **kw)
    # Warm up: capture the decode graphs and compile the kernels for every batch size seen.
    engine.generate(input_ids=prompts, sampling_params={"temperature": 0.0, "max_new_tokens": 16,
                                                        "ignore_eos": True})
    runs = [timed_run(engine, prompts, out_len, pool_tokens, algo, args) for _ in range(args.repeats)]
    res = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]  # the median run's details
    res["tok_s_runs"] = [r["tok_s"] for r in runs]
    engine.shutdown()
    return res


def timed_run(engine, prompts, out_len: int, pool_tokens: int, algo: str | None, args) -> dict:
    P = len(prompts[0])
    sch, alloc = engine.scheduler, engine.kv.allocator
    sch.max_running = sch.decode_steps = sch.decode_seq_steps = sch.num_preemptions = 0
    alloc.peak_used = 0
    c0 = engine.compressor.num_compressions if engine.compressor else 0
    # The engine schedules a step once per loop iteration and every iteration waits for one
    # step's tokens, so in steady state the time between two schedule calls is a step's
    # duration: record (time, requests running) at each.
    marks: list[tuple[float, int]] = []
    schedule = sch.schedule

    def timed_schedule():
        batch = schedule()
        marks.append((time.perf_counter(), len(sch.running)))
        return batch

    sch.schedule = timed_schedule
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params={
        "temperature": 0.0, "max_new_tokens": out_len, "ignore_eos": True})
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    sch.schedule = schedule
    busy = [(b[0] - a[0], a[1]) for a, b in zip(marks, marks[1:]) if a[1]]
    time_weighted = sum(d * n for d, n in busy) / max(sum(d for d, _ in busy), 1e-9)
    per_req = P + out_len if algo is None else max(P + 1, args.budget + args.divide_length)
    n = sum(len(o["output_ids"]) for o in outs)
    info = engine.get_server_info()
    slot_bytes = info["kv_pool"]["bytes_per_slot"]
    ring = info.get("compression", {}).get("query_ring_bytes", 0)
    res = {
        "algorithm": algo or "dense", "pool_tokens": pool_tokens, "tok_s": n / dt, "seconds": dt,
        "tokens": n, "concurrent": time_weighted,
        "mean_decode_batch": sch.decode_seq_steps / max(sch.decode_steps, 1),
        "capacity": pool_tokens // per_req,
        "max_concurrent": sch.max_running, "preemptions": sch.num_preemptions,
        "peak_kv_slots": alloc.peak_used, "peak_kv_bytes": alloc.peak_used * slot_bytes + ring,
        "pool_bytes": info["kv_pool"]["bytes"], "query_ring_bytes": ring,
        "compressions": (engine.compressor.num_compressions - c0) if engine.compressor else 0,
        "first_ids": outs[0]["output_ids"][:8],
    }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=4096)
    ap.add_argument("--dense-seqs", type=int, default=64, help="dense sequences the tight pool holds")
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--divide-length", type=int, default=128)
    ap.add_argument("--algorithms", default="rkv,snapkv,streamingllm")
    ap.add_argument("--ample-algorithms", default="rkv", help="compressed runs on the ample pool")
    ap.add_argument("--skip-tight", action="store_true")
    ap.add_argument("--skip-ample", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per configuration (one engine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a GPU"
    gpu = torch.cuda.get_device_name()
    R, P, O = args.requests, args.prompt_len, args.output_len
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, 151000, (R, P), generator=g).tolist()
    tight, ample = args.dense_seqs * (P + O), R * (P + O)
    results = {"gpu": gpu, "torch": torch.__version__, "requests": R, "prompt_len": P,
               "output_len": O, "budget": args.budget, "divide_length": args.divide_length,
               "tight_pool_tokens": tight, "ample_pool_tokens": ample, "tight": [], "ample": []}

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))

    with tempfile.TemporaryDirectory() as d:
        build_checkpoint("qwen2.5-0.5b", Path(d), args.seed, torch.bfloat16)  # throughput.py's model
        plans = []
        if not args.skip_tight:
            plans += [("tight", tight, a) for a in [None] + args.algorithms.split(",")]
        if not args.skip_ample:
            plans += [("ample", ample, a) for a in [None] + [x for x in args.ample_algorithms.split(",") if x]]
        for kind, pool, algo in plans:
            res = run_config(d, prompts, O, pool, algo, args)
            results[kind].append(res)
            print(kind, json.dumps(res), flush=True)
            save()

    for kind in ("tight", "ample"):
        rows = results[kind]
        if not rows:
            continue
        dense = next(r for r in rows if r["algorithm"] == "dense")
        print(f"\n{kind} pool ({rows[0]['pool_tokens']:,} slots):")
        print("| algorithm | concurrent (time-avg / max) | vs dense | capacity | output tok/s "
              "| vs dense | peak KV bytes | preemptions |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            runs = r["tok_s_runs"]
            print(f"| {r['algorithm']} | {r['concurrent']:.1f} / {r['max_concurrent']} "
                  f"| {r['concurrent'] / dense['concurrent']:.2f}x | {r['capacity']} "
                  f"| {r['tok_s']:,.0f} ({min(runs):,.0f}-{max(runs):,.0f}) "
                  f"| {r['tok_s'] / dense['tok_s']:.2f}x "
                  f"| {r['peak_kv_bytes'] / 1e9:.2f} GB | {r['preemptions']} |")
    save()


if __name__ == "__main__":
    main()
