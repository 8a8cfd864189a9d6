"""The engine thread's cost of a session continuation prefill against a fresh prefill of the
same rows and new tokens, as the held context grows (is anything on the host O(context)?).

For each held context C of ``--contexts``: ``--rows`` sessions each prefill a C-token prompt
(one token decoded: turn 1), then, ``--repeats`` times, (a) the rows continue their sessions
with ``--new`` tokens each (one prefill step: sessions' adoption, the ExtendLayout, attention
over the held KV), and (b) the same number of fresh requests of ``--new`` distinct tokens
(no prefix-cache hit) prefill. Each step is recorded by multiturn_probe.StepProbe; printed per
C: medians of the step's launch ms (host, plus the device's time on the CPU), whole
engine-thread iteration ms, for both, and continuation minus fresh. On the CPU the difference
includes the attention over the held KV itself (real compute, O(rows x new x C)); host work
that grows with C shows up as a difference far above that (``--profile`` splits it by op).
``--cudnn-sdp off,on`` runs it all once per setting of the engine's cuDNN attention (the held
context grows every repeat, so every continuation step has new attention shapes).

    python -m benchmarks.engine.continuation_prefill --tiny
    python -m benchmarks.engine.continuation_prefill --model-dir M --contexts 128,1024,4096
    python -m benchmarks.engine.continuation_prefill --model-dir M --cudnn-sdp off,on
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from benchmarks.engine.multiturn_probe import StepProbe, profiled
from benchmarks.engine.multiturn_throughput import cudnn_settings, default_device
from benchmarks.engine.multiturn_profile import one_look

ONE = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 1}


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _prefill(engine, probe, body, one_step: bool = True) -> dict:
    """The one prefill step `body` makes (its request finishes after one token); a turn 1 of
    long prompts may take several (the engine's prefill token limit): the last is kept."""
    probe.enabled = True
    try:
        results = engine.generate(**body)
    finally:
        probe.enabled = False
    steps = probe.take()
    if not steps or (one_step and len(steps) != 1):
        raise RuntimeError(f"expected one prefill step, got {len(steps)}")
    return {**steps[-1], "results": results}


def one_context(engine, probe, context: int, args, rng, vocab: int, profile_dir=None) -> list[dict]:
    """Turn 1 of C tokens in each of --rows sessions, then the repeats (profiled alone when
    profile_dir is given: turn 1's long fresh prefill would swamp them)."""
    sids = engine.open_sessions(args.rows)
    try:
        first = _prefill(engine, probe, {
            "input_ids": [_ids(rng, context, vocab) for _ in sids], "sampling_params": ONE,
            "session_params": [{"id": s} for s in sids]}, one_step=False)
        rids = [r["meta_info"]["id"] for r in first["results"]]
        run = lambda: repeats(engine, probe, context, args, rng, vocab, sids, rids)  # noqa: E731
        if profile_dir is None:
            return run()
        out, tables = profiled(engine.loop, run, profile_dir, args.device.startswith("cuda"))
        return [{**r, "profile": tables} for r in out]
    finally:
        engine.close_sessions(sids)


def repeats(engine, probe, context, args, rng, vocab, sids, rids) -> list[dict]:
    """--repeats times: the sessions continue with --new tokens, then as many fresh rows."""
    out = []
    for _ in range(args.repeats):
        cont = _prefill(engine, probe, {
            "input_ids": [_ids(rng, args.new, vocab) for _ in sids], "sampling_params": ONE,
            "session_params": [{"id": s, "rid": r} for s, r in zip(sids, rids)]})
        rids = [r["meta_info"]["id"] for r in cont["results"]]
        fresh = _prefill(engine, probe, {
            "input_ids": [_ids(rng, args.new, vocab) for _ in sids], "sampling_params": ONE})
        out.append({"cudnn_sdp": args.setting, "context": context, "continuation": _step(cont),
                    "fresh": _step(fresh)})
    return out


def _step(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != "results"}


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for setting, context in dict.fromkeys((r["cudnn_sdp"], r["context"]) for r in runs):
        mine = [r for r in runs if (r["cudnn_sdp"], r["context"]) == (setting, context)]
        med = lambda kind, key: statistics.median(r[kind][key] for r in mine)  # noqa: E731
        row = {"cudnn_sdp": setting, "context": context, "rows": mine[0]["continuation"]["rows"],
               "new_tokens": mine[0]["continuation"]["tokens"],
               "held_max": mine[0]["continuation"]["max_held"],
               "continuations": mine[0]["continuation"]["continuations"]}
        for kind in ("continuation", "fresh"):
            for key in ("launch_ms", "wall_ms"):
                row[f"{kind}_{key}"] = med(kind, key)
        row["extra_launch_ms"] = row["continuation_launch_ms"] - row["fresh_launch_ms"]
        rows.append(row)
    return rows


def start(args, model_dir: str):
    from sglang_kvc import Engine

    longest = max(args.contexts) + (args.repeats + 1) * (args.new + 2) + 16
    cuda = args.device.startswith("cuda")
    kw = dict(model_path=model_dir, device=args.device, dtype="bfloat16" if cuda else "float32",
              context_length=longest, max_running_requests=2 * args.rows,
              max_total_tokens=3 * args.rows * longest + 4096)
    if cuda:  # every request ends at its prefill's token: no decode step to capture
        kw.update(mem_fraction_static=0.5, cuda_graph=False)
    return Engine(**kw)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--tiny", action="store_true", help="the tiny test model on the CPU")
    p.add_argument("--contexts", default="64,256,1024", help="held context lengths, comma list")
    p.add_argument("--rows", type=int, default=16, help="sessions continued in one step")
    p.add_argument("--new", type=int, default=64, help="new tokens per row")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="profile the smallest and the largest context's repeats (their own "
                        "runs, after the timed ones): DIR/context_<C>/ (multiturn_profile)")
    p.add_argument("--cudnn-sdp", default="off",
                   help="comma list of the engine's cuDNN attention settings (off, on), in order")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.settings = cudnn_settings(p, args.cudnn_sdp)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        p.error(f"--contexts {args.contexts!r}: a comma list of integers")
    if min(args.contexts) < 1 or args.rows < 1 or args.new < 1 or args.repeats < 1:
        p.error("--contexts, --rows, --new and --repeats must be positive")
    args.device = args.device or default_device(args.tiny)
    return args


def run(args, model_dir: str) -> dict:
    from sglang_kvc import cudnn_sdp_allowed, set_cudnn_sdp

    engine, default = start(args, model_dir), cudnn_sdp_allowed()
    runs, tables = [], {}
    try:
        probe = StepProbe(engine.loop)
        vocab = engine.runner.cfg.vocab_size
        rng = random.Random(0)
        for args.setting in args.settings:
            set_cudnn_sdp(args.setting == "on")
            one_context(engine, probe, min(args.contexts), args, rng, vocab)  # warm-up
            runs += [r for c in args.contexts for r in one_context(engine, probe, c, args, rng, vocab)]
            tables.update(profile_runs(engine, probe, args, rng, vocab))
    finally:
        set_cudnn_sdp(default)
        engine.shutdown()
    return {"args": vars(args), "runs": runs, "rows": summarize(runs), "profile": tables}


def profile_runs(engine, probe, args, rng, vocab) -> dict:
    """The smallest and the largest context's repeats under the profiler (does any op grow
    with the context?), after the timed ones: DIR/context_<C>_cudnn_<setting>/."""
    if not args.profile:
        return {}
    out = {}
    for c in sorted({min(args.contexts), max(args.contexts)}):
        name = f"context_{c}_cudnn_{args.setting}"
        runs = one_context(engine, probe, c, args, rng, vocab, Path(args.profile) / name)
        out[name] = runs[0]["profile"]
    return out


def report(out: dict) -> None:
    cols = list(out["rows"][0])
    print(" ".join(f"{c:>20}" for c in cols))
    for r in out["rows"]:
        print(" ".join(f"{v:20.3f}" if isinstance(v, float) else f"{v:>20}" for v in r.values()))
    for name, tables in (out["profile"] or {}).items():
        for kind in ("continuation", "fresh"):
            print(f"{name}: {one_look(tables, kind)}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            from benchmarks.engine.multiturn_throughput import tiny_model

            model_dir = tiny_model(Path(tmp))
        else:
            model_dir = args.model_dir
        out = run(args, model_dir)
    report(out)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
