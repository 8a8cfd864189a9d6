"""Decode throughput and host time per step of the sglang_kvc engine vs HF `generate`, same model,
same run.

Shapes with random bf16 weights (no hub access needed): `qwen2.5-0.5b` (tied, vocab 151,936) and
`smollm2-135m` (Llama, hidden 576, 30 layers, vocab 49,152). Batch B, prompt P random token ids,
O output tokens with ignore_eos; greedy by default, or `--temperature 1 --logprobs` as RL
rollouts sample. Each engine mode (`--modes overlap,sequential`) runs `--repeats` times on one
engine; min / median / max are printed. Reports output tok/s, the fraction of the HBM roofline
(the formula below), the same for the decode steps alone (the end-to-end figure also holds the
prefill), and the engine thread's host time per decode step (everything but waiting
for the GPU's outputs: schedule, input preparation, launches, output processing):

    step bytes = W + B * S_mean * k,  W = all weights (a tied embedding read once as the LM head),
    k = 2 * layers * kv_heads * head_dim * 2 bytes,  S_mean = P + O / 2,
    roofline tok/s = B / (step bytes / HBM bandwidth).

`--profile DIR` writes a torch profiler trace of 16 decode steps (after `--profile-skip`) and
prints the kernels, device->host copies per step, and the GPU time by kernel family against each
family's HBM floor (decode_families.py).

    PYTHONPATH=sglang-kvc:. python -m benchmarks.engine.throughput [--shape smollm2-135m --batch 64]
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

from benchmarks.common.checkpoint import build_checkpoint, param_count
from benchmarks.engine.decode_families import family_table, floors_ms, step_families
from benchmarks.engine.step_probes import GraphTimer, count_syncs

# HBM bandwidth by GPU name (datasheet, bytes/s; the H100 SXM's 3.35 TB/s).
HBM_BW = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def qwen25_05b_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                       tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                       rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645)


def smollm2_135m_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                       tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
                       rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def tiny_config():
    """Two layers of the Qwen2 family: CPU smoke runs (decode_tail.py --device cpu); the vocabulary
    is the tiny tokenizer's, padded (common/checkpoint.py builds it)."""
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=448,
                       tie_word_embeddings=True, max_position_embeddings=1024, rope_theta=1e6,
                       rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1)


SHAPES = {"qwen2.5-0.5b": qwen25_05b_config, "smollm2-135m": smollm2_135m_config,
          "tiny": tiny_config}


# Sent explicitly, as the trainer's rollouts do: the engine's sampling_defaults="model" otherwise
# takes top_p / top_k from the checkpoint's generation_config.json (the random checkpoints carry
# Qwen's top_p 0.8, top_k 20), and the filtered sampler path then sorts the vocabulary every step.
UNFILTERED = {"top_p": 1.0, "top_k": -1, "min_p": 0.0}


def sampling(args, out_len: int) -> dict:
    if args.temperature > 0:
        return {"temperature": args.temperature, "max_new_tokens": out_len, "ignore_eos": True,
                "sampling_seed": args.seed, **UNFILTERED}
    return {"temperature": 0.0, "max_new_tokens": out_len, "ignore_eos": True}


def bench_hf(path: str, prompts: torch.Tensor, out_len: int, args) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = prompts.cuda()
    kw = dict(eos_token_id=None, pad_token_id=0)  # no EOS: ignore_eos
    kw.update(dict(do_sample=True, temperature=args.temperature, top_k=0) if args.temperature > 0
              else dict(do_sample=False))
    model.generate(ids[:8], attention_mask=torch.ones_like(ids[:8]), max_new_tokens=8, **kw)  # warm up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    res = {"tok_s": n / dt, "seconds": dt, "tokens": n, "peak_gb": torch.cuda.max_memory_allocated() / 1e9}
    del model, out
    torch.cuda.empty_cache()
    return res


def make_engine(path: str, B: int, P: int, O: int, overlap: bool, args, config: str = ""):
    from sglang_kvc import Engine

    return Engine(model_path=path, skip_tokenizer_init=True, dtype=_dtype(args),
                  device="auto" if args.device == "cuda" else args.device,  # (auto: as before on a GPU)
                  max_total_tokens=args.pool_tokens or B * (P + O) + 1024,
                  max_running_requests=B, cuda_graph_max_bs=B, context_length=P + O + 16,
                  cuda_graph=_cuda(args) and not args.no_cuda_graph, mem_fraction_static=0.85,
                  disable_overlap_schedule=not overlap, **config_kwargs(args, config))


def _cuda(args) -> bool:
    return args.device.startswith("cuda")


def _dtype(args) -> str:
    """bf16 as the GPU runs; fp32 on a CPU (its dry runs check the path, not the speed)."""
    return "bfloat16" if _cuda(args) else "float32"


def _sync(engine) -> None:
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()


def config_kwargs(args, config: str) -> dict:
    """An entry of --configs (``dense``, ``rkv``, ``rkv@fp8_e4m3``, ...) as engine arguments;
    "" = the --compress / --kv-cache-dtype flags."""
    if not config:
        return dict(compress_kwargs(args), kv_cache_dtype=args.kv_cache_dtype)
    algo, _, kv_dtype = config.partition("@")
    return dict(compress_kwargs(argparse.Namespace(**{**vars(args), "compress": _ALGOS[algo]})),
                kv_cache_dtype=kv_dtype or "auto")


_ALGOS = {"dense": "none", "none": "none", "rkv": "rkv", "snapkv": "snapkv",
          "streamingllm": "streamingllm"}


def compress_kwargs(args) -> dict:
    """--compress: the engine compresses as training/rl_step.py's --compress runs do (step_length,
    8-query window)."""
    if args.compress == "none":
        return {}
    return dict(compress_algorithm=args.compress, compress_max_prompt=args.kv_budget,
                compress_divide_length=args.compress_divide_length, compress_max_window=8,
                compress_divide_method="step_length")


def timed_generate(engine, ids: list, params: dict, logprobs: bool, graph_timer: bool = True) -> dict:
    engine.loop.step_stats = type(engine.step_stats)()  # fresh counters
    _sync(engine)
    captures = _captures(engine)
    timer = GraphTimer(engine)
    t0 = time.perf_counter()
    with timer.active() if graph_timer else contextlib.nullcontext():
        outs = engine.generate(input_ids=ids, sampling_params=params, return_logprob=logprobs)
    _sync(engine)
    dt = time.perf_counter() - t0
    n = sum(len(o["output_ids"]) for o in outs)
    stats = engine.step_stats.to_dict()
    # The decode steps alone (each request's first token comes from its prefill step).
    decode_tok_s = (n - len(outs)) / max(stats["decode_s"], 1e-9)
    wall_ms = 1e3 * stats["decode_s"] / max(stats["decode_steps"], 1)
    return {"tok_s": n / dt, "decode_tok_s": decode_tok_s, "seconds": dt, "tokens": n, **stats,
            "step_ms": wall_ms, "gpu_graph_ms_per_step": timer.ms_per_step(),
            "graph_captures": _captures(engine) - captures, "first_ids": outs[0]["output_ids"][:16]}


def _captures(engine) -> int:
    return engine.runner.graphs.num_captures if engine.runner.graphs is not None else 0


def syncs_per_step(engine, ids: list, params: dict, logprobs: bool) -> float | None:
    """Synchronizing torch calls per decode step beyond each step's one output read, over one
    more run of the same requests (counted apart: the warnings cost host time). None on a CPU
    (no device to sync with; the run is still made, as on the GPU)."""
    if engine.runner.device.type != "cuda":
        engine.generate(input_ids=ids, sampling_params=params, return_logprob=logprobs)
        return None
    engine.loop.step_stats = type(engine.step_stats)()
    with count_syncs() as seen:
        engine.generate(input_ids=ids, sampling_params=params, return_logprob=logprobs)
    return seen[0] / max(engine.step_stats.decode_steps, 1)


_KEYS = ("tok_s", "decode_tok_s", "host_ms_per_step", "gpu_wait_ms_per_step", "step_ms",
         "gpu_graph_ms_per_step")


def bench_modes(path: str, prompts: torch.Tensor, out_len: int, modes: list[str], args,
                config: str = "") -> dict:
    """Every mode of `modes` on one engine (overlap is a switch of its step loop): the same
    graphs, pool and warm caches, so the modes' ratios hold nothing else."""
    B, P = prompts.shape
    if _cuda(args):
        torch.cuda.reset_peak_memory_stats()
    engine = make_engine(path, B, P, out_len, True, args, config)
    ids = prompts.tolist()
    params = sampling(args, out_len)
    # Warm-up with the timed runs' sampling mode (log-probs too): its graph is captured here,
    # not inside the first timed run (issue 68's lane read 1 capture there, 2 per engine life).
    engine.generate(input_ids=ids, sampling_params=dict(params, max_new_tokens=32),
                    return_logprob=args.logprobs)
    res = {}
    for mode in modes:
        engine.loop.overlap = engine.overlap = mode == "overlap"
        res[mode] = summarize([timed_generate(engine, ids, params, args.logprobs, not args.no_graph_timer)
                               for _ in range(args.repeats)])
        if args.count_syncs:
            res[mode]["syncs_per_step"] = syncs_per_step(engine, ids, params, args.logprobs)
        print(f"engine ({config or 'flags'}, {mode}):", json.dumps(res[mode]), flush=True)
    peak = None
    if _cuda(args):  # a stable KV pool (the default) is outside torch's allocator: added back
        pool = engine.get_server_info()["kv_pool"]
        peak = (torch.cuda.max_memory_allocated() + pool["bytes"] * pool["stable_address"]) / 1e9
    common = {"peak_gb": peak, "kv_pool_gb": engine.kv.pool.bytes / 1e9,
              "preemptions": engine.scheduler.num_preemptions,
              "graph_captures_engine_life": _captures(engine)}
    for mode in modes:
        res[mode].update(common)
    if args.profile:
        res[modes[0]]["profile"] = profile_steps(engine, ids, params, args, skip=args.profile_skip,
                                                 name=config or "engine")
    if args.host_breakdown:
        res[modes[0]]["host_us_per_step"] = host_breakdown(engine, ids, params, args)
    engine.shutdown()
    return res


def summarize(runs: list[dict]) -> dict:
    res = {"runs": runs}
    for key in _KEYS:
        vals = [r[key] for r in runs if r[key] is not None]
        if vals:
            res[key] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
    res["graph_captures_in_runs"] = sum(r["graph_captures"] for r in runs)
    return res


def profile_steps(engine, ids, params, args, skip: int = 4, steps: int = 16, name: str = "engine",
                  row_limit: int = 30) -> dict:
    """Kernels and device->host copies per decode step, profiled over `steps` decode steps of
    an unchanged batch (after `skip` warm steps; prefill excluded). On a CPU: the torch ops
    per step (each one a kernel launch on the GPU's eager path). Writes DIR/NAME_trace.json and
    the top `row_limit` kernels to DIR/NAME_kernels.txt (DIR: args.profile)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.runner.device.type == "cuda"
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    launch, seen, held = engine.runner.launch, [0], []

    def windowed(batch):  # runs on the engine thread
        if not batch.is_prefill:
            seen[0] += 1
            if skip < seen[0] <= skip + steps:  # the K/V slots this step reads (R-KV: fewer)
                held.append(sum(s.kv_len for s in batch.seqs))
            if seen[0] == skip + 1:
                _sync(engine)
                prof.start()
            elif seen[0] == skip + steps + 1:
                _sync(engine)
                prof.stop()
        return launch(batch)

    engine.runner.launch = windowed
    engine.generate(input_ids=ids, sampling_params=dict(params, max_new_tokens=skip + steps + 8),
                    return_logprob=args.logprobs)
    engine.runner.launch = launch
    write_profile(prof, args.profile, name, cuda, row_limit)
    return {**_per_step(prof, steps, cuda), "context": len(ids[0]) + skip + steps // 2,
            "held_slots_per_step": statistics.fmean(held) if held else 0.0}


def write_profile(prof, out_dir: str, name: str, cuda: bool, row_limit: int) -> str:
    """The trace and the kernel table (by device time; CPU time on a CPU), printed too."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(f"{out_dir}/{name}_trace.json")
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=row_limit)
    with open(f"{out_dir}/{name}_kernels.txt", "w") as f:
        f.write(table)
    print(table)
    return table


def _per_step(prof, steps: int, cuda: bool) -> dict:
    if not cuda:
        ops = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        return {"steps": steps, "torch_ops_per_step": len(top) / steps,
                "aten_calls_per_step": len(ops) / steps}
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    d2h = sum(1 for e in events if "DtoH" in e.name)
    kernels = [e for e in events if "Memcpy" not in e.name and "Memset" not in e.name]
    gpu_us = sum(e.device_time for e in events)
    return {"steps": steps, "d2h_copies_per_step": d2h / steps, "kernels_per_step": len(kernels) / steps,
            "gpu_busy_ms_per_step": gpu_us / 1e3 / steps, "families": step_families(events, steps)}


def host_breakdown(engine, ids, params, args, steps: int = 64) -> dict:
    """Host microseconds per decode step in each stage of the engine loop (wall time without any
    device sync, so GPU work is not counted except where a stage waits for it: `result`)."""
    totals: dict[str, float] = {}
    r = engine.runner

    def wrap(obj, name, label):
        fn = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - t
            return out
        setattr(obj, name, timed)
        return fn

    originals = [(engine.scheduler, "schedule"), (r, "launch"), (r, "_decode"), (r, "sampler"),
                 (r.rows, "record"), (r, "_sampling_batch"), (engine.loop, "_process"),
                 (r, "after_step"), (engine.loop, "_complete_inflight")]  # (the loop's, not Engine's)
    saved = [(o, n, wrap(o, n, n.strip("_"))) for o, n in originals]
    engine.step_stats.__init__()
    engine.generate(input_ids=ids, sampling_params=dict(params, max_new_tokens=steps + 1),
                    return_logprob=args.logprobs)
    for o, n, fn in saved:
        setattr(o, n, fn)
    n = max(engine.step_stats.decode_steps, 1)
    out = {k: 1e6 * v / n for k, v in totals.items()}
    out["wait (in complete_inflight)"] = 1e6 * engine.step_stats.gpu_wait_s / n
    return out


def roofline(num_params: int, shape: str, B: int, P: int, O: int, gpu: str) -> dict:
    cfg = SHAPES[shape]()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    k = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    W = num_params * 2
    s_mean = P + O / 2
    bw = next((v for name, v in HBM_BW.items() if name in gpu), 3.35e12)
    step_bytes = W + B * s_mean * k
    return {"tok_s": B / (step_bytes / bw), "hbm_tb_s": bw / 1e12, "step_gb": step_bytes / 1e9,
            "weight_bytes": W, "kv_bytes_per_token": k}


def report(results: dict) -> None:
    gpu, hf = results["gpu"], results.get("hf", {})
    roof = results["roofline"]["tok_s"]
    print(f"\n{gpu}, {results['shape']}, B={results['batch']} P={results['prompt_len']} "
          f"O={results['output_len']}, T={results['temperature']}, logprobs={results['logprobs']}; "
          f"dense roofline {roof:,.0f} tok/s; HF generate {hf.get('tok_s', float('nan')):,.0f} tok/s")
    print("| config | mode | tok/s min / median / max | of roofline (median) | vs HF | decode steps only: "
          "tok/s (median), of roofline | step ms | host ms/step | GPU ms/step (graph) | GPU wait ms/step "
          "| syncs/step | graph captures (runs / engine life) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for config, modes in results["configs"].items():
        for mode, e in modes.items():
            print(_row(config, mode, e, roof, hf))
    _ratios(results["configs"])
    _families(results)


def _families(results: dict) -> None:
    """The profiled steps' kernel families against their HBM floors (decode_families.py)."""
    roof = results["roofline"]
    for config, modes in results["configs"].items():
        prof = next(iter(modes.values())).get("profile", {})
        if "families" not in prof:
            continue
        held = prof["held_slots_per_step"]
        floors = floors_ms(roof["weight_bytes"], held * roof["kv_bytes_per_token"],
                           roof["hbm_tb_s"] * 1e12)
        print(f"\n{config}: GPU time per decode step by kernel family, at context {prof['context']} "
              f"({held / results['batch']:.0f} K/V slots held a request)")
        print(family_table(prof["families"], floors))


def _med(e: dict, key: str) -> float:
    return e.get(key, {}).get("median", float("nan"))


def _row(config: str, mode: str, e: dict, roof: float, hf: dict) -> str:
    t, d = e["tok_s"], _med(e, "decode_tok_s")
    syncs = e.get("syncs_per_step")
    return (f"| {config} | {mode} | {t['min']:,.0f} / {t['median']:,.0f} / {t['max']:,.0f} "
            f"| {100 * t['median'] / roof:.1f}% | x{t['median'] / hf.get('tok_s', float('nan')):.2f} "
            f"| {d:,.0f}, {100 * d / roof:.1f}% | {_med(e, 'step_ms'):.3f} "
            f"| {_med(e, 'host_ms_per_step'):.3f} | {_med(e, 'gpu_graph_ms_per_step'):.3f} "
            f"| {_med(e, 'gpu_wait_ms_per_step'):.3f} | {'-' if syncs is None else f'{syncs:.2f}'} "
            f"| {e['graph_captures_in_runs']} / {e['graph_captures_engine_life']} |")


def _ratios(configs: dict) -> None:
    """Each config's decode step time over the first config's, mode by mode."""
    names = list(configs)
    if len(names) < 2:
        return
    base = configs[names[0]]
    print(f"\ndecode step time / {names[0]}'s (median ms per step):")
    for name in names[1:]:
        parts = [f"{mode} {_med(e, 'step_ms') / _med(base[mode], 'step_ms'):.2f}x"
                 for mode, e in configs[name].items() if mode in base]
        print(f"  {name}: " + ", ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=256, help="concurrent requests")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=512, help="generated tokens per request")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (both engines)")
    ap.add_argument("--logprobs", action="store_true", help="engine returns sampled logprobs")
    ap.add_argument("--modes", default="overlap,sequential",
                    help="engine modes: overlap and/or sequential (--disable-overlap-schedule)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine mode")
    ap.add_argument("--pool-tokens", type=int, default=0, help="KV pool size (0 = fits the batch)")
    ap.add_argument("--skip-hf", action="store_true", help="do not run HF generate")
    ap.add_argument("--compress", default="none", choices=["none", "rkv", "snapkv", "streamingllm"],
                    help="KV compression (as training/rl_step.py --compress)")
    ap.add_argument("--kv-budget", type=int, default=128, help="--compress-max-prompt")
    ap.add_argument("--compress-divide-length", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default="auto", help="engine KV dtype (auto, fp8_e4m3, ...)")
    ap.add_argument("--configs", default="",
                    help="comma list run in this one process, e.g. dense,rkv,dense@fp8_e4m3,"
                         "rkv@fp8_e4m3 (algorithm[@kv dtype]; the budget and divide length from "
                         "the flags); default: the one config --compress / --kv-cache-dtype give")
    ap.add_argument("--count-syncs", action="store_true",
                    help="one more run per mode counting synchronizing torch calls per step")
    ap.add_argument("--no-cuda-graph", action="store_true", help="eager decode steps")
    ap.add_argument("--no-graph-timer", action="store_true",
                    help="no CUDA events around the graph replays (no GPU ms per step; A/B of the probe)")
    ap.add_argument("--profile", default=None, help="directory for a profiler trace of decode steps")
    ap.add_argument("--profile-skip", type=int, default=4,
                    help="decode steps before the profiled 16 (their context: prompt + this + 8)")
    ap.add_argument("--host-breakdown", action="store_true", help="host time per stage of a step")
    ap.add_argument("--device", default="cuda",
                    help="cuda, or cpu for a dry run of the path (--shape tiny; no HF, no graphs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("benchmarks.engine.throughput: no GPU (--device cpu --shape tiny for a dry run)")
    if args.device == "cpu":
        args.skip_hf = True  # (HF generate's timing means nothing on a CPU)
    elif not args.device.startswith("cuda"):
        raise SystemExit(f"--device: cuda or cpu, got {args.device!r}")
    for config in filter(None, (c.strip() for c in args.configs.split(","))):
        if config.partition("@")[0] not in _ALGOS:
            raise SystemExit(f"--configs: unknown algorithm in {config!r} (one of {', '.join(_ALGOS)})")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"overlap", "sequential"}:
        raise SystemExit(f"--modes: expected overlap and/or sequential, got {args.modes!r}")
    gpu = torch.cuda.get_device_name() if _cuda(args) else "cpu"
    B, P, O = args.batch, args.prompt_len, args.output_len
    g = torch.Generator().manual_seed(args.seed)
    vocab = SHAPES[args.shape]().vocab_size
    prompts = torch.randint(0, vocab - 100, (B, P), generator=g)
    results = {"gpu": gpu, "shape": args.shape, "batch": B, "prompt_len": P, "output_len": O,
               "temperature": args.temperature, "logprobs": args.logprobs, "torch": torch.__version__,
               "compress": args.compress, "kv_budget": args.kv_budget,
               "engine": {}}
    with tempfile.TemporaryDirectory() as d:
        dtype = torch.bfloat16 if _cuda(args) else torch.float32
        results["params"] = param_count(build_checkpoint(args.shape, Path(d), args.seed, dtype))
        if not args.skip_hf:
            results["hf"] = bench_hf(d, prompts, O, args)
            print("HF generate:", json.dumps(results["hf"]), flush=True)
        results["roofline"] = roofline(results["params"], args.shape, B, P, O, gpu)
        configs = [c.strip() for c in args.configs.split(",") if c.strip()] or [""]
        results["configs"] = {}
        for config in configs:
            results["configs"][config or args.compress] = bench_modes(d, prompts, O, modes, args, config)
            results["engine"] = next(iter(results["configs"].values()))  # (the lane summary's key)
            write_json(results, args.json)  # after each config: a run cut at its limit keeps those done
    report(results)


def write_json(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
