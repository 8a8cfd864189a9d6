"""One long rollout's wall time, split (issue 68: where a 4k R-KV rollout's ~2.5 ms a step goes).

The engine is the one `studies/long_rollout.py`'s RL step builds (the same trainer flags through
`trainer.arguments`: pool --dense-fraction of dense's need at the cap, R-KV budget and divide
length, trainer sampling top_p 1 / top_k -1 / min_p 0, T 1 with log-probs), in this process. Per
config: a warm-up rollout (the long-tail lengths' short first rollout: compiles, graph
captures), the KV pool released and resumed as the colocated trainer does each step, then ONE
timed rollout of prompts x samples with the long-tail lengths of the timed steps, submitted as
the trainer submits it and parsed as it parses it (`parse_output`). Reported:

- prefill steps and seconds; decode steps, host and GPU-wait seconds per step (median, sum);
  each replayed step graph's GPU ms (CUDA events around the replay);
- compression events (after-step calls that compacted) with host seconds and GPU span;
- assembly: from the end of the last decode step to the responses as dicts, then to the
  trainer's `Generation`s; the response dicts' build seconds on the engine thread;
- the garbage collector's pauses during the rollout, by generation (any thread);
- what is left of the wall (intake, idle, commands);
- CUDA graph captures and pool addresses (`DecodeGraphs.stats`) in the warm-up and the timed
  rollout, and over the engine's life;
- with --profile DIR: a torch.profiler kernel table (top 25 by device time) over 16 decode steps
  at --profile-context tokens, and one over one compression event (engine/throughput.py's
  profile_steps).

    python -m benchmarks.studies.rollout_split --configs dense rkv:512 --profile DIR --json OUT
    python -m benchmarks.studies.rollout_split --shape tiny --prompts 8 --samples 8 \\
        --response-len 1024 --configs dense rkv:128 --eviction-record   # CPU: the host costs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.long_tail import LongTailLengths
from benchmarks.engine.rollout_probes import gc_pauses, recording_stats, spread, timing
from benchmarks.engine.step_probes import GraphTimer
from benchmarks.engine.rollout_profile import profile_rollout
from benchmarks.studies import long_rollout
from benchmarks.training import rl_step


def trainer_namespace(args, cfg: dict, hf: Path, work: Path) -> argparse.Namespace:
    """The trainer's parsed flags for one long_rollout config: its rl_step command, parsed as
    rl_step parses it, then as the trainer parses rl_step's (the long4k run's engine flags)."""
    argv = long_rollout.config_argv(args, cfg, args.response_len, hf, work / "unused.json", work,
                                    launcher=())[2:]  # (past "-m benchmarks.training.rl_step")
    rl_args, extra = rl_step.parse_args(argv)
    from trainer.arguments import parse_args as trainer_args

    work.mkdir(parents=True, exist_ok=True)
    data = rl_step.write_prompts(work / "prompts.jsonl", args.prompts, args.seed)
    return trainer_args(rl_step.trainer_argv(rl_args, hf, data, work, 1) + extra)


def start_engine(targs):
    from sglang_kvc import Engine
    from trainer.rollout.engines.config import server_args_from

    return Engine(server_args=server_args_from(targs))


def rollout_config(targs, args):
    """The trainer's sampling (seeded here: the same tokens run after run), and its eviction
    records when --eviction-record (the sparse-replay runs ask for them)."""
    from trainer.rollout.config import sampling_config_from_args

    cfg = sampling_config_from_args(targs)
    return dataclasses.replace(cfg, seed=args.seed, eviction_record=args.eviction_record or cfg.eviction_record)


def requests(args, rcfg, prompts: list[list[int]], warmup: bool) -> list:
    """The rollout's samples with long_rollout's long-tail lengths (the warm-up's short ones, or
    the first timed step's)."""
    from trainer.rollout.engines.interface import SampleRequest

    tail = LongTailLengths(args.response_len, args.median_frac, args.sigma, seed=args.seed,
                           warmup_scale=args.warmup_scale)
    tail.rollouts = 0 if warmup else 1
    lengths = tail.lengths(args.prompts * args.samples)
    more = {"ignore_eos": True} if args.ignore_eos else {}
    return [SampleRequest.of(prompts[i // args.samples], rcfg, args.seed + i, max_new_tokens=n, **more)
            for i, n in enumerate(lengths)]


def run_rollout(engine, reqs: list, rcfg) -> list:
    """Submit and parse as the trainer's in-process engine does (inprocess.py)."""
    from trainer.rollout.engines.interface import batch_body, parse_output

    outs = [f.result() for f in engine.submit_generate(batch_body(reqs, rcfg))]
    return [parse_output(o, rcfg.eviction_record) for o in outs]


def graph_stats(engine) -> dict | None:
    graphs = engine.runner.graphs
    return None if graphs is None else graphs.stats()


def captures(engine, key: str = "captures"):
    """The engine's graph captures so far (or their seconds: key "capture_s"); 0 without graphs."""
    stats = graph_stats(engine)
    return stats[key] if stats else 0


def offload_cycle(engine, targs) -> bool:
    """Release and resume the KV pool between rollouts when the run offloads (the colocated
    trainer's kv_memory around each rollout); True when done."""
    from trainer.rollout.engines.config import engine_config_from_args

    if not engine_config_from_args(targs).offloads():  # (the GPU default)
        return False
    engine.release_memory(["kv_cache"])
    engine.resume_memory(["kv_cache"])
    return True


@dataclasses.dataclass
class Clock:
    """The timed rollout's instants (perf_counter seconds)."""

    start: float = 0.0
    submitted: float = 0.0
    dicts: float = 0.0
    parsed: float = 0.0


def timed_rollout(engine, reqs: list, rcfg) -> tuple[dict, list]:
    """One rollout with every probe on; returns its split and the Generations."""
    from trainer.rollout.engines.interface import batch_body, parse_output

    cuda, comp, plain = engine.runner.device.type == "cuda", engine.runner.compressor, type(engine.step_stats)
    stats, timer, clock = recording_stats(engine), GraphTimer(engine), Clock()
    preempted, caps, caps_s = engine.scheduler.num_preemptions, captures(engine), captures(engine, "capture_s")
    with contextlib.ExitStack() as stack:
        stack.enter_context(timer.active())
        builds = stack.enter_context(timing(engine.loop.outputs, "build", False))
        events = stack.enter_context(_compression_timing(comp, cuda)) if comp else None
        gc_s = stack.enter_context(gc_pauses())
        batches = stack.enter_context(_decode_batches(engine.runner))
        clock.start = time.perf_counter()
        futures = engine.submit_generate(batch_body(reqs, rcfg))
        clock.submitted = time.perf_counter()
        outs = [f.result() for f in futures]
        clock.dicts = time.perf_counter()
        gens = [parse_output(o, rcfg.eviction_record) for o in outs]
        clock.parsed = time.perf_counter()
    split = summarize(stats, clock, builds, events, timer)
    split["by_batch"] = by_batch(batches, stats.steps, _synced(timer.pairs))
    split.update(gc=gc_s, preemptions=engine.scheduler.num_preemptions - preempted,
                 graph_captures=captures(engine) - caps,
                 graph_capture_s=captures(engine, "capture_s") - caps_s, samples=len(gens),
                 tokens=sum(len(g.response_ids) for g in gens),
                 longest=max(len(g.response_ids) for g in gens))
    engine.loop.step_stats = plain()  # the engine's own counters again
    return split, gens


@contextlib.contextmanager
def _decode_batches(runner):
    """The running batch's size at every decode step launched (in launch order, as the step
    counters add them)."""
    launch, sizes = runner.launch, []

    def counted(batch):
        if not batch.is_prefill:
            sizes.append(len(batch.seqs))
        return launch(batch)
    runner.launch = counted
    try:
        yield sizes
    finally:
        del runner.launch  # the class's method again


# batch-size bands of the step table: is the step's time a fixed cost or the batch's?
BANDS = ((193, 256), (129, 192), (65, 128), (17, 64), (1, 16))


def by_batch(sizes: list[int], steps: list, pairs: list) -> list[dict]:
    """Median step, host and graph GPU ms of the decode steps in each batch-size band (graph
    GPU ms only when every step replayed a graph: then the pairs align with the steps)."""
    gpu = [s.elapsed_time(e) for s, e in pairs] if len(pairs) == len(sizes) else None
    rows = []
    for lo, hi in BANDS:
        idx = [i for i, n in enumerate(sizes[:len(steps)]) if lo <= n <= hi]
        if idx:
            rows.append({"batch": f"{lo}-{hi}", "steps": len(idx),
                         "step_ms": 1e3 * statistics.median(steps[i][0] + steps[i][1] for i in idx),
                         "host_ms": 1e3 * statistics.median(steps[i][0] for i in idx),
                         "graph_gpu_ms": statistics.median(gpu[i] for i in idx) if gpu else None})
    return rows


def _compression_timing(comp, cuda: bool):
    """The compressor's after-step calls that compacted (its event counter moved)."""
    return timing(comp, "after_step", cuda, keep=lambda out, before: comp.num_compressions != before,
                  state=lambda: comp.num_compressions)


def summarize(stats, clock: Clock, builds, events, timer) -> dict:
    host, wait = [s[0] for s in stats.steps], [s[1] for s in stats.steps]
    last = stats.steps[-1][2] if stats.steps else clock.submitted
    wall = clock.parsed - clock.start
    parts = {"prefill_s": sum(stats.prefills), "decode_s": sum(host) + sum(wait),
             "last_step_to_dicts_s": clock.dicts - last, "dicts_to_generations_s": clock.parsed - clock.dicts}
    out = {"wall_s": wall, **parts, "other_s": wall - sum(parts.values()),
           "submit_s": clock.submitted - clock.start, "assembly_s": clock.parsed - last,
           "prefill_steps": len(stats.prefills), "decode_steps": len(host),
           "host_ms_per_step": _ms(spread(host)), "gpu_wait_ms_per_step": _ms(spread(wait)),
           "step_ms": _ms(spread([h + w for h, w in zip(host, wait)])),
           "graph_gpu_ms_per_step": spread([s.elapsed_time(e) for s, e in _synced(timer.pairs)]),
           "builds": spread(builds.host_s), "builds_after_last_step": _after(builds, last),
           "idle_s": stats.idle_s, "command_s": stats.command_s}
    if events is not None:
        out["compression"] = {"events": len(events.host_s), "host_s": spread(events.host_s),
                              "gpu_span_ms": spread(events.gpu_ms())}
    return out


def _synced(pairs: list) -> list:
    if pairs:
        torch.cuda.synchronize()
    return pairs


def _after(builds, last: float) -> int:
    """Response dicts built after the last decode step ended (that step's finishers: built
    while the caller waits)."""
    return sum(1 for t in builds.ends if t > last)


def _ms(s: dict | None) -> dict | None:
    return None if s is None else {k: (v if k == "count" else 1e3 * v) for k, v in s.items()}


def run_config(args, spec: str, hf: Path, work: Path, prompts: list[list[int]]) -> dict:
    cfg = long_rollout.parse_config(spec)
    targs = trainer_namespace(args, cfg, hf, work / long_rollout.run_name(cfg, args.response_len))
    engine = start_engine(targs)
    try:
        return measure(engine, targs, cfg, args, prompts)
    finally:
        engine.shutdown()


def measure(engine, targs, cfg: dict, args, prompts: list[list[int]]) -> dict:
    rcfg = rollout_config(targs, args)
    t = time.perf_counter()
    run_rollout(engine, requests(args, rcfg, prompts, warmup=True), rcfg)
    res = {"config": cfg["name"], "pool_slots": engine.kv.pool.num_slots, "warmup_s": time.perf_counter() - t, "warmup_graph_captures": captures(engine)}
    res["offload_cycle"] = offload_cycle(engine, targs)
    reqs = requests(args, rcfg, prompts, warmup=False)
    res["rollout"], gens = timed_rollout(engine, reqs, rcfg)
    res["graphs_engine_life"] = graph_stats(engine)
    res["first_ids"] = gens[0].response_ids[:8]
    if args.profile:
        res["profile"] = profile_rollout(engine, prompts, reqs, args, run_name(cfg))
    return res


def run_name(cfg: dict) -> str:
    return cfg["name"].replace(":", "_").replace("@", "_").replace("+", "_")


def report(results: dict) -> None:
    print(f"\n{results['device']}, {results['shape']}, {results['prompts']} x {results['samples']} "
          f"samples, answers up to {results['response_len']} (long tail), pool "
          f"{results['dense_fraction']} of dense's need; seconds of ONE rollout:")
    print("| config | wall | prefill (steps) | decode steps | decode s | step ms | host ms | "
          "GPU wait ms | graph GPU ms | compressions: events, s host, ms GPU | last step -> "
          "dicts | dicts -> Generations | other | builds: n, s | GC s | captures warm-up / timed / life |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---|")
    for name, res in results["configs"].items():
        print(row(name, res))
    print("\ndecode steps by batch size (medians): config | batch | steps | step ms | host ms | graph GPU ms")
    for name, res in results["configs"].items():
        for b in res["rollout"]["by_batch"]:
            gpu = "-" if b["graph_gpu_ms"] is None else f"{b['graph_gpu_ms']:.3f}"
            print(f"  {name} | {b['batch']} | {b['steps']} | {b['step_ms']:.3f} | {b['host_ms']:.3f} | {gpu}")


def row(name: str, res: dict) -> str:
    r, med = res["rollout"], lambda d: float("nan") if not d else d["median"]
    comp = r.get("compression")
    comp_s = "-" if comp is None else (
        f"{comp['events']}, {(comp['host_s'] or {}).get('sum', 0):.3f}, "
        f"{(comp['gpu_span_ms'] or {}).get('sum', float('nan')):.1f}")
    life = (res["graphs_engine_life"] or {}).get("captures", 0)
    return (f"| {name} | {r['wall_s']:.2f} | {r['prefill_s']:.2f} ({r['prefill_steps']}) "
            f"| {r['decode_steps']} | {r['decode_s']:.2f} | {med(r['step_ms']):.3f} "
            f"| {med(r['host_ms_per_step']):.3f} | {med(r['gpu_wait_ms_per_step']):.3f} "
            f"| {med(r['graph_gpu_ms_per_step']):.3f} | {comp_s} | {r['last_step_to_dicts_s']:.3f} "
            f"| {r['dicts_to_generations_s']:.3f} | {r['other_s']:.3f} "
            f"| {(r['builds'] or {}).get('count', 0)}, {(r['builds'] or {}).get('sum', 0):.3f} "
            f"| {r['gc']['total_s']:.3f} | {res['warmup_graph_captures']} / {r['graph_captures']} / {life} |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="benchmarks.common.checkpoint shape")
    p.add_argument("--configs", nargs="+", default=["dense", "rkv:512"],
                   help="long_rollout configs (dense, rkv:BUDGET[:DIVIDE], ...)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64, help="random prompt tokens")
    p.add_argument("--response-len", type=int, default=4096, help="the cap of the answers")
    p.add_argument("--dense-fraction", type=float, default=0.25, help="as long_rollout's")
    p.add_argument("--median-frac", type=float, default=0.5, help="as long_rollout's")
    p.add_argument("--sigma", type=float, default=0.6, help="as long_rollout's")
    p.add_argument("--warmup-scale", type=float, default=0.125, help="as long_rollout's")
    p.add_argument("--eviction-record", action="store_true",
                   help="ask for eviction records (what --sparse-recompute runs ask)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every sample runs to its length (a CPU's tiny random model emits EOS early)")
    p.add_argument("--profile", default=None, metavar="DIR", help="kernel tables and traces here")
    p.add_argument("--profile-context", type=int, default=2048, help="tokens at the decode window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    for spec in args.configs:
        long_rollout.parse_config(spec)  # (a bad one exits naming --configs)
    if args.response_len < 2 or args.prompts < 1 or args.samples < 1:
        p.error("--response-len >= 2, --prompts and --samples >= 1")
    # what long_rollout.config_argv reads besides these
    args.steps, args.stale_steps, args.max_tokens_per_gpu, args.extra = 1, 0, 0, []
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        hf = build_checkpoint(args.shape, work / "hf")
        vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
        g = torch.Generator().manual_seed(args.seed)
        prompts = torch.randint(0, vocab - 100, (args.prompts, args.prompt_len), generator=g).tolist()
        results = {"device": _device(), "shape": args.shape, "prompts": args.prompts,
                   "samples": args.samples, "response_len": args.response_len,
                   "dense_fraction": args.dense_fraction, "configs": {}}
        for spec in args.configs:
            args.divide_length = long_rollout.parse_config(spec).get("divide", 0)
            results["configs"][spec] = run_config(args, spec, hf, work, prompts)
            _write(results, args.json)  # after each config: a cut run keeps those done
    report(results)
    return results


def _device() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _write(results: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
