"""Decode milliseconds per step at small batch: the tail of a long rollout (issue 42), where the
last samples decode alone and every step's fixed costs show.

For each batch B in --batches: B requests of --prompt-len random token ids, --output-len tokens
each with ignore_eos, so every decode step holds exactly B rows at context P..P+O. One engine
serves every B (CUDA graphs on, captured by a warm-up generate per B); --repeats timed generates
per B and mode give min / median / max of, per decode step:

- step_ms: the engine thread's time (host + GPU wait, engine StepStats);
- host_ms: all of it but waiting for the step's outputs (schedule, input staging, replay launch,
  output readback and processing); with overlap scheduling it runs while the GPU computes;
- replay_ms: the host's time inside graph.replay() (launching the captured step);
- host_outside_replay_ms: host_ms - replay_ms, the Python and torch work around the replay;
- gpu_wait_ms: waiting for the step's outputs.

Printed beside them: the weights' read time (bytes / HBM bandwidth, throughput.HBM_BW), a
small-batch step's floor. `--breakdown` adds host microseconds per decode step in each stage of
the loop (schedule; launch, which holds the graph's input load and its replay; the outputs'
parse, net of the wait; their processing; compression). Overlap mode hides host time under the
GPU's; `--modes overlap,sequential` also runs each step read before the next (the same engine).

GPU (Qwen2.5-0.5B shape, random bf16 weights):
    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.decode_tail --breakdown --json tail.json
CPU smoke (tiny shape, eager: a CPU has no graphs; checks the plumbing, not the numbers):
    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.decode_tail --shape tiny --device cpu \\
        --batches 1,2 --prompt-len 8 --output-len 6 --repeats 2 --breakdown

Internals timed (a component micro-benchmark, tests/test_layout.py): a public `sglang_kvc.Engine`,
with `--breakdown` timing its step loop's stages (`engine.step_io.PendingStep.result`) and its
`engine.step_loop.StepStats` reset per generate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.engine.throughput import HBM_BW, SHAPES, UNFILTERED

METRICS = ("step_ms", "host_ms", "replay_ms", "host_outside_replay_ms", "gpu_wait_ms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=2048, help="context at the first step")
    ap.add_argument("--output-len", type=int, default=256, help="tokens per request")
    ap.add_argument("--repeats", type=int, default=5, help="timed generates per batch and mode")
    ap.add_argument("--modes", default="overlap", help="overlap and/or sequential")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--logprobs", action="store_true", help="return sampled logprobs (RL)")
    ap.add_argument("--cuda-graph-bs", default=None, help="engine --cuda-graph-bs (default ladder)")
    ap.add_argument("--no-cuda-graph", action="store_true", help="eager decode steps")
    ap.add_argument("--breakdown", action="store_true", help="host time per stage of a step")
    ap.add_argument("--model-dir", default=None,
                    help="keep the random checkpoint here (built once, reused by later runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args(argv)
    args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.mode_list or set(args.mode_list) - {"overlap", "sequential"}:
        ap.error(f"--modes: overlap and/or sequential, got {args.modes!r}")
    return args


def make_engine(path: str, args):
    from sglang_kvc import Engine

    B, P, O = max(args.batch_list), args.prompt_len, args.output_len
    cuda = args.device.startswith("cuda")
    # (only when set: an engine from before --cuda-graph-bs then still runs as a baseline)
    extra = {"cuda_graph_bs": args.cuda_graph_bs} if args.cuda_graph_bs else {}
    return Engine(model_path=path, skip_tokenizer_init=True, device=args.device,
                  dtype="bfloat16" if cuda else "float32", max_total_tokens=B * (P + O) + 1024,
                  max_running_requests=B, cuda_graph_max_bs=B, context_length=P + O + 16,
                  cuda_graph=not args.no_cuda_graph, mem_fraction_static=0.85, **extra)


def sampling(args, out_len: int) -> dict:
    params = {"temperature": args.temperature, "max_new_tokens": out_len, "ignore_eos": True,
              **UNFILTERED}  # not the checkpoint's top_p / top_k (throughput.UNFILTERED)
    if args.temperature > 0:
        params["sampling_seed"] = args.seed
    return params


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def replay_counters(engine) -> tuple[int, float]:
    """(replays, host seconds in them) so far; zeros without graphs or from an engine that does
    not count them (a baseline run of older engine code)."""
    graphs = engine.runner.graphs
    return getattr(graphs, "replays", 0), getattr(graphs, "replay_s", 0.0)


def on_engine_thread(engine, fn, *a):
    """Run fn between two engine steps: the step that answered the last request has been
    counted (sequential mode counts it after the answer), and no step reads what fn sets."""
    return engine.loop.call(fn, *a)


def fresh_stats(engine) -> None:
    from sglang_kvc.engine.step_loop import StepStats

    on_engine_thread(engine, setattr, engine.loop, "step_stats", StepStats())


def generate(engine, ids: list, params: dict, args) -> None:
    engine.generate(input_ids=ids, sampling_params=params, return_logprob=args.logprobs)
    on_engine_thread(engine, _sync, args.device)


def timed_run(engine, ids: list, params: dict, args) -> dict:
    """One generate; the per-decode-step figures of its engine thread."""
    fresh_stats(engine)
    r0, s0 = replay_counters(engine)
    generate(engine, ids, params, args)
    st, (r1, s1) = engine.step_stats, replay_counters(engine)
    n = max(st.decode_steps, 1)
    ms = lambda s: 1e3 * s / n  # noqa: E731
    return {"decode_steps": st.decode_steps, "graphed_steps": r1 - r0,
            "step_ms": ms(st.host_s + st.gpu_wait_s), "host_ms": ms(st.host_s),
            "replay_ms": ms(s1 - s0), "host_outside_replay_ms": ms(st.host_s - (s1 - s0)),
            "gpu_wait_ms": ms(st.gpu_wait_s)}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _stages(engine) -> list[tuple[object, str, str, callable]]:
    """(object, method, label, whether a call belongs to a decode step given (args, result))."""
    decode_arg = lambda a, r: not a[0].is_prefill  # noqa: E731
    stages = [(engine.scheduler, "schedule", "schedule", lambda a, r: r is not None and not r.is_prefill),
              (engine.runner, "launch", "launch", decode_arg),
              (engine.loop, "_process", "process outputs", decode_arg),
              (engine.runner, "after_step", "after_step (compression)", decode_arg)]
    if engine.runner.graphs is not None:
        graphs = engine.runner.graphs
        stages += [(graphs, "_load", "  launch: graph input load", lambda a, r: True),
                   (graphs, "_replay", "  launch: graph replay", lambda a, r: True)]
    return [st for st in stages if hasattr(st[0], st[1])]  # (older engine code: what it has)


def _timed(label: str, is_decode, totals: dict):
    def wrap(fn):
        def timed(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            if is_decode(a, out):
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - t
            return out
        return timed
    return wrap


def _timed_result(totals: dict):
    """PendingStep.result less its wait for the GPU: the outputs' parse."""
    def wrap(fn):
        def timed(step):
            t = time.perf_counter()
            out = fn(step)
            if not step.batch.is_prefill:
                label = "parse outputs (net of the wait)"
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - t - step.wait_s
            return out
        return timed
    return wrap


@contextlib.contextmanager
def _patched(obj, name: str, wrap):
    """obj.name = wrap(obj.name) for the block; an instance's own attribute or its class's."""
    own, original = name in vars(obj), getattr(obj, name)
    setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        if own:
            setattr(obj, name, original)
        else:
            delattr(obj, name)


def stage_breakdown(engine, ids: list, params: dict, args) -> dict:
    """Host microseconds per decode step in each stage of the loop, over one generate."""
    from sglang_kvc.engine.step_io import PendingStep

    totals: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        for obj, name, label, is_decode in _stages(engine):
            stack.enter_context(_patched(obj, name, _timed(label, is_decode, totals)))
        stack.enter_context(_patched(PendingStep, "result", _timed_result(totals)))
        fresh_stats(engine)
        generate(engine, ids, params, args)
    n = max(engine.step_stats.decode_steps, 1)
    out = {k: 1e6 * v / n for k, v in totals.items()}
    out["gpu wait"] = 1e6 * engine.step_stats.gpu_wait_s / n
    return out


def padded_to(graphs, B: int) -> int | None:
    """The graph size batch B runs in (None: eager)."""
    if graphs is None or not graphs.can_run(B):
        return None
    return next(s for s in graphs.sizes if s >= B)


def run_batch(engine, B: int, args, gen: torch.Generator) -> dict:
    vocab = SHAPES[args.shape]().vocab_size
    ids = torch.randint(0, vocab - 100, (B, args.prompt_len), generator=gen).tolist()
    params = sampling(args, args.output_len)
    warm = dict(params, max_new_tokens=min(8, args.output_len))
    graphs = engine.runner.graphs
    res = {"padded_to": padded_to(graphs, B)}
    for mode in args.mode_list:
        on_engine_thread(engine, setattr, engine.loop, "overlap", mode == "overlap")
        generate(engine, ids, warm, args)  # captures this size's graph (and sampling mode)
        runs = [timed_run(engine, ids, params, args) for _ in range(args.repeats)]
        res[mode] = {"runs": runs, **{k: spread([r[k] for r in runs]) for k in METRICS}}
        if args.breakdown:
            res[mode]["breakdown_us"] = stage_breakdown(engine, ids, params, args)
    on_engine_thread(engine, setattr, engine.loop, "overlap", True)
    return res


def checkpoint(args, tmp: str) -> Path:
    """The random checkpoint: --model-dir's if it holds one, else built there (or in tmp)."""
    path = Path(args.model_dir or tmp)
    if not (path / "config.json").is_file():
        path.mkdir(parents=True, exist_ok=True)
        build_checkpoint(args.shape, path, args.seed, torch.bfloat16)
    return path


def weights_read_ms(path: Path, device: str) -> float | None:
    """Reading the checkpoint's weights (bf16, a tied embedding once) at the HBM bandwidth of
    this GPU: the floor of a small-batch step. None on a CPU."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    bw = next((v for k, v in HBM_BW.items() if k in name), 3.35e12)
    return 1e3 * sum(f.stat().st_size for f in path.glob("*.safetensors")) / bw


def report(res: dict) -> None:
    print(f"\n{res['gpu']}, {res['shape']}, P={res['prompt_len']} O={res['output_len']}, "
          f"T={res['temperature']}, logprobs={res['logprobs']}, graphs={res['graphs']} "
          f"{res['graph_sizes']}; weights read {res['weights_read_ms']} ms")
    for mode in res["modes"]:
        print(f"\n{mode}: ms per decode step, min / median / max (host columns: median)")
        print("| B | padded to | step ms | host ms | replay ms | host outside replay ms "
              "| GPU wait ms | graphed / decode steps |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|")
        for B, r in res["batches"].items():
            print(table_row(B, r, mode))
        for B, r in res["batches"].items():
            if "breakdown_us" in r[mode]:
                parts = ", ".join(f"{k} {v:.1f}" for k, v in r[mode]["breakdown_us"].items())
                print(f"B={B} host us/step: {parts}")


def table_row(B: str, r: dict, mode: str) -> str:
    m, last = r[mode], r[mode]["runs"][-1]
    s = m["step_ms"]
    return (f"| {B} | {r['padded_to']} | {s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f} "
            + "".join(f"| {m[k]['median']:.3f} " for k in METRICS[1:])
            + f"| {last['graphed_steps']} / {last['decode_steps']} |")


def measure(engine, path: Path, args) -> dict:
    gen = torch.Generator().manual_seed(args.seed)
    graphs = engine.runner.graphs
    res = {"gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
           "shape": args.shape, "prompt_len": args.prompt_len, "output_len": args.output_len,
           "temperature": args.temperature, "logprobs": args.logprobs,
           "graphs": graphs is not None, "graph_sizes": graphs.sizes if graphs else None,
           "weights_read_ms": weights_read_ms(path, args.device),
           "modes": args.mode_list, "torch": torch.__version__,
           "batches": {str(B): run_batch(engine, B, args, gen) for B in args.batch_list}}
    res["captures"] = graphs.stats() if graphs is not None else None
    return res


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no GPU: pass --device cpu (with --shape tiny) for a smoke run")
    with tempfile.TemporaryDirectory() as d:
        path = checkpoint(args, d)
        engine = make_engine(str(path), args)
        try:
            res = measure(engine, path, args)
        finally:
            engine.shutdown()
    report(res)
    print(json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
