"""The rollout phase inside the RL loop against the same engine alone, on the same requests.

Runs the real loop (``rl_step.py``'s ``Run``: in-process engine with the per-rollout KV
offload, reward, π_old recompute, update, weight sync) on ``--prompts x --samples`` samples
with ~``--prompt-len``-token prompts and ``--response-len``-token answers (random weights do not
stop: every answer runs to the cap), then replays the last rollout's request body on the same
engine, in the same process, with the pool resident and its graphs warm: the isolated figure.

    python -m benchmarks.training.rollout_in_loop --shape qwen2.5-0.5b --prompts 32 --samples 8 \\
        --prompt-len 128 --response-len 512 --compress none --steps 2 --json OUT.json

Per measured step, the rollout phase broken down (wall seconds; host-only pieces overlap the
GPU's work and are listed for where the engine thread's time goes):

* pool resume / release: the KV pool allocated (zeroed) before and freed (``empty_cache``)
  after the rollout (offload), each timed to a device sync;
* graph captures: decode CUDA graphs captured in this rollout (the pool came back elsewhere);
* decode steps: the engine's ``StepStats`` (host and GPU-wait seconds);
* prefill and the rest of the engine's time: generate's wall less decode and captures;
* compression / schedule / output processing: host seconds of ``after_step``, ``schedule``
  and ``_process`` on the engine thread;
* parse: ``Generation`` objects built from the engine's outputs; outside the engine: the
  rest of the phase (prompt batching, shard gather);
* log-probs: the isolated replay with and without ``return_logprob`` (its cost, not in-loop);
* weight sync: the step's separate sync phase.

The decode steps' achieved HBM bandwidth is the bytes a decode step must read (weights + the
rows' KV, ``rl_step.DecodeModel``) over the decode seconds, against the GPU's peak.
Ratios are within one call: in-loop tokens/s over isolated tokens/s of the same requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.report import emit
from benchmarks.training import rl_step as rl
from benchmarks.training.train_step import device_name

FILLER = "Let's think step by step and output the final answer within \\boxed{}.".split()


@dataclasses.dataclass
class Probe:
    """Wall seconds of wrapped methods (optionally to a device sync), and the last request body."""

    totals: dict = dataclasses.field(default_factory=dict)
    bodies: list = dataclasses.field(default_factory=list)

    def wrap(self, obj, name: str, label: str, sync: bool = False) -> None:
        fn = getattr(obj, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if sync and torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)

    def record_bodies(self, engine) -> None:
        submit = engine.submit_generate

        def recorded(body, *a, **kw):
            self.bodies.append(body)
            return submit(body, *a, **kw)

        engine.submit_generate = recorded

    def snapshot(self) -> dict:
        return dict(self.totals)


def attach(engines) -> Probe:
    """Wrap the in-process engine's pieces (``EngineRollout``)."""
    engine, probe = engines.engine, Probe()
    probe.wrap(engine, "resume_memory", "pool_resume_s", sync=True)
    probe.wrap(engine, "release_memory", "pool_release_s", sync=True)
    probe.wrap(engines, "run", "engine_run_s")
    probe.wrap(engines, "_run_once", "generate_s")
    probe.wrap(engine.runner, "after_step", "compression_host_s")
    probe.wrap(engine.scheduler, "schedule", "schedule_host_s")
    probe.wrap(engine.loop, "_process", "output_host_s")
    probe.record_bodies(engine)
    return probe


def engine_counters(engine) -> dict:
    s, graphs = engine.step_stats, engine.get_server_info().get("cuda_graphs") or {}
    return {"decode_steps": s.decode_steps, "decode_s": s.host_s + s.gpu_wait_s,
            "decode_host_s": s.host_s, "decode_gpu_wait_s": s.gpu_wait_s,
            "graph_captures": graphs.get("captures", 0), "graph_capture_s": graphs.get("capture_s", 0.0)}


def deltas(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def breakdown(metrics: dict, probe_d: dict, counters_d: dict) -> dict:
    """One in-loop rollout's pieces (module docstring)."""
    gen = probe_d.get("generate_s", 0.0)
    out = {"rollout_s": metrics["time_rollout"], **counters_d,
           **{k: probe_d.get(k, 0.0) for k in ("pool_resume_s", "pool_release_s", "generate_s",
                                                 "compression_host_s", "schedule_host_s",
                                                 "output_host_s")}}
    out["prefill_and_rest_s"] = gen - counters_d["decode_s"] - counters_d["graph_capture_s"]
    out["parse_s"] = probe_d.get("engine_run_s", 0.0) - gen
    out["outside_engine_s"] = (metrics["time_rollout"] - probe_d.get("engine_run_s", 0.0)
                               - out["pool_resume_s"] - out["pool_release_s"])
    out["sync_s"] = metrics["time_sync"]
    out["rollout_tokens_per_s"] = metrics["rollout_tokens_per_s"]
    for k in ("time_recompute", "time_update", "time_total", "response_len_mean",
              "prompt_len_mean", "memory/peak_reserved_gib"):
        if k in metrics:
            out[k] = metrics[k]
    return out


def replay(engine, body: dict, repeats: int, logprobs: bool) -> list[dict]:
    """The recorded body on the engine alone: one short warm-up (graph captures after the
    pool came back), then ``repeats`` timed runs."""
    body = dict(body, return_logprob=logprobs)
    short = dict(body, sampling_params=_with_max_new(body["sampling_params"], 16))
    _wait(engine.submit_generate(short))
    runs = []
    for _ in range(repeats):
        before = engine_counters(engine)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = _wait(engine.submit_generate(body))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens = sum(len(o["output_ids"]) for o in outs)
        runs.append({"seconds": dt, "tokens": tokens, "tokens_per_s": tokens / dt,
                     **deltas(engine_counters(engine), before)})
    return runs


def _with_max_new(params, n: int):
    if isinstance(params, list):
        return [dict(p, max_new_tokens=n) for p in params]
    return dict(params, max_new_tokens=n)


def _wait(futures) -> list[dict]:
    return [f.result() for f in futures]


def spread(vals: list[float]) -> dict:
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


def summarize(rows: list[dict]) -> dict:
    keys = [k for k in rows[0] if all(isinstance(r.get(k), (int, float)) for r in rows)]
    return {k: spread([r[k] for r in rows]) for k in keys}


def hbm_fraction(decode, prompt_lens, response_lens, decode_s: float, peak: float | None) -> dict:
    """Bytes every decode step must read over the decode seconds, against ``peak``."""
    if not decode_s:
        return {}
    achieved = decode.bytes(prompt_lens, response_lens) / decode_s
    out = {"decode_hbm_tb_s": achieved / 1e12}
    if peak:
        out["decode_hbm_fraction"] = achieved / peak
    return out


def write_prompts(path: Path, hf: Path, n: int, prompt_len: int, seed: int) -> Path:
    """Quickstart arithmetic prompts, each led by filler words to ~``prompt_len`` tokens (a
    word over at most)."""
    from transformers import AutoTokenizer

    from trainer.quickstart import make_rows

    tok = AutoTokenizer.from_pretrained(str(hf))
    rows = []
    for r in make_rows(n, seed):
        words = []
        while len(tok(" ".join(words + [r["prompt"]]))["input_ids"]) < prompt_len:
            words.append(FILLER[len(words) % len(FILLER)])
        rows.append({**r, "prompt": " ".join(words + [r["prompt"]])})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def start_run(args, extra: list[str], work: Path):
    """``rl_step.start_run`` with the padded prompts; a checkpoint and its torch_dist
    import already in ``work`` are reused (the dense and R-KV runs of the lane share them)."""
    from trainer.arguments import parse_args as trainer_args
    from trainer.launch import init_parallel, parallel_config_from_args
    from trainer.train import Run, run_config_from_args

    hf = Path(args.hf_checkpoint) if args.hf_checkpoint else work / "hf"
    if not (hf / "config.json").is_file():  # a --workdir shared by runs keeps one checkpoint
        build_checkpoint(args.shape, hf)
    data = write_prompts(work / "prompts.jsonl", hf, args.prompts * (args.steps + 2), args.prompt_len,
                         args.seed)
    targs = trainer_args(rl.trainer_argv(args, hf, data, work, 1 + args.steps) + extra)
    init_parallel(parallel_config_from_args(targs))
    return targs, Run(run_config_from_args(targs))


def measure(args, targs, run) -> dict:
    from checkpoint_tools.model_config import load_arch

    engines = run.rollouts.parts.manager.engines
    probe, engine = attach(engines), engines.engine
    machine = rl.Machine.detect(args)
    decode = rl.DecodeModel.from_run(load_arch(targs.hf_checkpoint), targs)
    rows = []
    for i in range(1 + args.steps):
        p0, c0 = probe.snapshot(), engine_counters(engine)
        metrics = run.rollout_step(i)
        row = breakdown(metrics, deltas(probe.snapshot(), p0), deltas(engine_counters(engine), c0))
        print(f"[rollout-in-loop] step {i}{' (warm-up)' if not i else ''}: "
              f"{json.dumps({k: round(v, 4) for k, v in row.items() if isinstance(v, float)})}",
              flush=True)
        if i:
            rows.append(row)
    body = probe.bodies[-1]
    lens = _lengths(body, targs.rollout_max_response_len)
    engine.resume_memory(["kv_cache"])
    try:
        iso = replay(engine, body, args.repeats, logprobs=bool(body.get("return_logprob")))
        no_lp = replay(engine, body, args.repeats, logprobs=False) if args.logprob_delta else []
    finally:
        engine.release_memory(["kv_cache"])
    return report(rows, iso, no_lp, decode, lens, machine)


def _lengths(body: dict, cap: int) -> tuple[list[int], list[int]]:
    """Prompt lengths of every sample of the body, and the cap as every response's length
    (random weights run to it: ``response_len_mean`` in the steps says how closely)."""
    ids, params = body["input_ids"], body["sampling_params"]
    params = params if isinstance(params, list) else [params] * len(ids)
    prompts = [len(p) for p, sp in zip(ids, params) for _ in range(sp.get("n", 1))]
    return prompts, [cap] * len(prompts)


def report(rows: list[dict], iso: list[dict], no_lp: list[dict], decode, lens, machine) -> dict:
    loop = summarize(rows)
    alone = summarize(iso)
    out = {"gpu": machine.name, "in_loop": loop, "in_loop_steps": rows, "isolated": alone,
           "isolated_runs": iso, "peak_hbm_bytes_per_s": machine.peak_hbm}
    med_loop, med_iso = loop["rollout_tokens_per_s"]["median"], alone["tokens_per_s"]["median"]
    out["in_loop_over_isolated"] = med_loop / med_iso
    out["in_loop_hbm"] = hbm_fraction(decode, *lens, loop["decode_s"]["median"], machine.peak_hbm)
    out["isolated_hbm"] = hbm_fraction(decode, *lens, alone["decode_s"]["median"], machine.peak_hbm)
    if no_lp:
        out["isolated_no_logprobs"] = summarize(no_lp)
        out["logprob_cost_s"] = alone["seconds"]["median"] - out["isolated_no_logprobs"]["seconds"]["median"]
    print_report(out)
    return out


def print_report(out: dict) -> None:
    loop, alone = out["in_loop"], out["isolated"]
    print("\n| piece (median over steps) | in the loop | engine alone |\n|---|---:|---:|")
    for key, iso_key in (("rollout_s", "seconds"), ("rollout_tokens_per_s", "tokens_per_s"),
                         ("pool_resume_s", None), ("graph_captures", "graph_captures"),
                         ("graph_capture_s", "graph_capture_s"), ("decode_steps", "decode_steps"),
                         ("decode_s", "decode_s"), ("decode_host_s", "decode_host_s"),
                         ("decode_gpu_wait_s", "decode_gpu_wait_s"), ("prefill_and_rest_s", None),
                         ("compression_host_s", None), ("schedule_host_s", None),
                         ("output_host_s", None), ("parse_s", None), ("pool_release_s", None),
                         ("outside_engine_s", None), ("sync_s", None)):
        a = loop.get(key, {}).get("median")
        b = alone.get(iso_key, {}).get("median") if iso_key else None
        print(f"| {key} | {_fmt(a)} | {_fmt(b)} |")
    print(f"\nin-loop / isolated tokens/s: {out['in_loop_over_isolated']:.3f} (target >= 0.90)")
    for name in ("in_loop_hbm", "isolated_hbm"):
        h = out[name]
        if h:
            frac = h.get("decode_hbm_fraction")
            print(f"{name}: {h['decode_hbm_tb_s']:.2f} TB/s"
                  + (f", {100 * frac:.1f}% of peak (target >= 50% dense)" if frac else ""))
    if "logprob_cost_s" in out:
        print(f"log-probs cost (isolated, with - without): {out['logprob_cost_s']:.3f} s")


def _fmt(v) -> str:
    return "" if v is None else f"{v:,.4g}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt (about)")
    p.add_argument("--repeats", type=int, default=2, help="timed isolated replays")
    p.add_argument("--logprob-delta", action=argparse.BooleanOptionalAction, default=True,
                   help="also replay without log-probs (their cost)")
    ours, rest = p.parse_known_args(argv)
    args, extra = rl.parse_args(rest)
    for k, v in vars(ours).items():
        setattr(args, k, v)
    return args, extra


def main(argv=None) -> dict:
    from checkpoint_tools import cpu_megatron

    args, extra = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rollout-in-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    targs, run = start_run(args, extra, work)
    try:
        result = measure(args, targs, run)
    finally:
        run.close()  # its engine processes too
        cpu_megatron.teardown()
    result.update(shape=args.shape, prompts=args.prompts, samples=args.samples,
                  prompt_len=args.prompt_len, response_len=args.response_len,
                  compress=args.compress, kv_budget=args.kv_budget,
                  max_tokens_per_gpu=run.learner.policy.train_cfg.max_tokens_per_gpu, device=device_name())
    return emit(result, args.json)


if __name__ == "__main__":
    main()
