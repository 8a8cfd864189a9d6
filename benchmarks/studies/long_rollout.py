"""The long-rollout RL step where KV memory binds: dense vs R-KV vs SnapKV in the same KV pool.

Each configuration runs the real training loop (``training/rl_step.py``: in-process engine,
reward, π_old recompute, update, weight sync) in its own process, on one shared random
checkpoint, with long-tailed response lengths (``common/long_tail.py``: log-normal around half the cap by
default, ~12% at the cap) and a KV pool sized as a deployment leaves it: ``--dense-fraction`` of what the
whole batch would hold densely at the cap (0.25: dense holds a quarter of the batch at once, as a
7B model on one 80 GB GPU does at 8k tokens).

    python -m benchmarks.studies.long_rollout --shape qwen2.5-0.5b --response-len 4096 8192 \\
        --configs dense rkv:512 rkv:1024 snapkv:512 snapkv:1024 --steps 2 \\
        --json runs/long.json --plot docs/plots/long_rollout_steps.png

A config ending in ``@fp8_e4m3`` / ``@fp8_e5m2`` runs with an FP8 KV pool of the same bytes
(``--sglang-kv-cache-dtype``, twice the slots); ratios stay against the bf16 dense row. A config
ending in ``+s1`` runs one step off-policy: ``--max-staleness 1`` with the engine in a child
process on the same GPU (``--rollout-engine-process``: an in-process engine that releases its KV
pool while training cannot generate meanwhile), so rollout n+1 generates while update n runs.

Per configuration and length: each phase's seconds in the steady state (min / median / max over
the timed steps after the first; ``--steps`` timed steps after a short warm-up rollout, at least
``--stale-steps`` for a ``+s1`` config), every timed step's seconds (``steps_s``), rollout
tokens/s, the pool's peak slots and capacity, preempted requests, and the tail: the share of the
rollout spent after 90% of the samples had finished. The step and rollout speed-ups are ratios to
on-policy bf16 dense at the same length, measured in one call; a ``+s1`` row also has its step's
ratio to ``dense+s1`` (``step_speedup_vs_s1``: off-policy against off-policy). Its rollout column
is what the step waited for the rollout (generated meanwhile), so it has no rollout speed-up.

``--json`` is rewritten after every configuration; on SIGTERM (``timeout``) the configuration
running is stopped and its timed steps so far are kept (rl_step rewrites its JSON every step), the
row marked with an ``error``, and the JSON written before the exit (143).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.report import emit
from benchmarks.common.runs import prepare_run_dir
from trainer.learner.speed import device_name

ROOT = Path(__file__).resolve().parents[2]

PHASES = ("rollout", "recompute", "update", "sync")
# "+s1": rollout n+1 generates while update n runs, in an engine process that keeps its pool
STALE_FLAGS = ("--rollout-engine-process", "--max-staleness", "1")
CUT_EXIT = 128 + signal.SIGTERM


def parse_config(spec: str) -> dict:
    """``dense`` or ``algorithm:budget[:divide_length]``, optionally ``@fp8_e4m3`` or
    ``@fp8_e5m2``: an FP8 KV pool of the same bytes (twice the slots), then optionally ``+s1``:
    one step off-policy (STALE_FLAGS)."""
    full = spec
    spec, stale = (spec[:-len("+s1")], True) if spec.endswith("+s1") else (spec, False)
    cfg = _parse_kv(spec)
    return {**cfg, "name": full, "stale": True} if stale else cfg


def _parse_kv(spec: str) -> dict:
    spec, _, kv = spec.partition("@")
    if kv not in ("", "fp8_e4m3", "fp8_e5m2"):
        raise SystemExit(f"--configs {spec}@{kv}: the KV dtype after @ is fp8_e4m3 or fp8_e5m2")
    name, kv = (f"{spec}@{kv}", {"kv_dtype": kv}) if kv else (spec, {})
    if spec == "dense":
        return {"name": name, "compress": "none", **kv}
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("rkv", "snapkv", "streamingllm"):
        raise SystemExit(f"--configs {spec!r}: expected dense or rkv|snapkv|streamingllm:BUDGET[:DIVIDE]")
    budget = int(parts[1])
    divide = int(parts[2]) if len(parts) == 3 else max(16, budget // 4)
    return {"name": name, "compress": parts[0], "budget": budget, "divide": divide, **kv}


def pool_tokens(args, cap: int, cfg: dict | None = None) -> int:
    """KV slots: --dense-fraction of the batch at the cap (prompt included, ~64 tokens) in bf16;
    an FP8 pool of the same bytes has twice the slots."""
    fp8 = 2 if cfg and cfg.get("kv_dtype") else 1
    return fp8 * int(args.dense_fraction * args.prompts * args.samples * (cap + 64))


def config_steps(args, cfg: dict) -> int:
    """Timed steps of one config: a ``+s1`` one at least ``--stale-steps``, so that its steady
    state (the steps after the first) is a median of several."""
    # (studies/layouts.py and others build these args without --stale-steps: --steps then)
    return max(args.steps, getattr(args, "stale_steps", 0)) if cfg.get("stale") else args.steps


def config_argv(args, cfg: dict, cap: int, hf: Path, out: Path, work: Path,
                launcher: tuple[str, ...] = (sys.executable,), more: tuple[str, ...] = ()
                ) -> list[str]:
    """``training/rl_step.py`` for one config at one cap, started by ``launcher`` (e.g. torchrun);
    ``more`` trainer flags go after the pool size (so they may override it), the user's last."""
    argv = [*launcher, "-m", "benchmarks.training.rl_step", "--hf-checkpoint", str(hf),
            "--prompts", str(args.prompts), "--samples", str(args.samples),
            "--response-len", str(cap), "--steps", str(config_steps(args, cfg)), "--seed", str(args.seed),
            "--max-tokens-per-gpu", str(args.max_tokens_per_gpu), "--json", str(out),
            "--workdir", str(work), "--compress", cfg["compress"]]
    if cfg["compress"] != "none":
        argv += ["--kv-budget", str(cfg["budget"]), "--compress-divide-length", str(cfg["divide"])]
    plugin = (f"cap={cap} median_frac={args.median_frac} sigma={args.sigma} "
              f"warmup_scale={args.warmup_scale} seed={args.seed}").split()
    if cfg.get("kv_dtype"):
        argv += ["--sglang-kv-cache-dtype", cfg["kv_dtype"]]
    if cfg.get("stale"):
        argv += list(STALE_FLAGS)
    return argv + ["--sglang-max-total-tokens", str(pool_tokens(args, cap, cfg)),
                   "--custom-generate-function-path", "benchmarks.common.long_tail.LongTailLengths",
                   "--custom-generate-args", *plugin, *more, *args.extra]


def run_name(cfg: dict, cap: int) -> str:
    """A config's run folder and JSON name at one cap (``rkv:512+s1`` at 4096: rkv_512_s1_4096)."""
    return f"{cfg['name'].replace(':', '_').replace('+', '_')}_{cap}"


def is_dense_reference(cfg: dict) -> bool:
    """The row the speed-ups are against: bf16 dense, on-policy."""
    return cfg["compress"] == "none" and not cfg.get("kv_dtype") and not cfg.get("stale")


@dataclasses.dataclass
class Children:
    """The config's rl_step process; SIGTERM stops it and the loop (``cut``)."""

    proc: subprocess.Popen | None = None
    cut: bool = False

    def on_term(self, signum, frame) -> None:
        self.cut = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # (under timeout the whole group has it already)

    def run(self, argv: list[str]) -> int:
        self.proc = subprocess.Popen(argv, cwd=ROOT)
        try:
            return self.proc.wait()
        finally:
            self.proc = None


CHILDREN = Children()


def run_config(args, cfg: dict, cap: int, hf: Path, work: Path) -> dict:
    """rl_step's result for one config (its ``steps``, ``summary``, ``steady``), or what a
    failed or cut run left: its timed steps so far with an ``error``, or the error alone."""
    name = run_name(cfg, cap)
    out, run_dir = work / f"{name}.json", work / name
    prepare_run_dir(run_dir, hf, work)
    out.unlink(missing_ok=True)  # a result of an earlier call in this workdir is not this one's
    argv = config_argv(args, cfg, cap, hf, out, run_dir)
    print(f"[long-rollout] {cfg['name']} at {cap} tokens: {' '.join(argv[1:])}", flush=True)
    return read_result(out, CHILDREN.run(argv))


def read_result(out: Path, code: int) -> dict:
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {}
    if code == 0 and result.get("summary"):
        return result
    steps = result.get("steps") or []
    why = f"exit {code}" + (f" after {len(steps)} timed step(s)" if steps else "")
    return {**result, "error": why} if steps else {"error": why}


def config_row(cfg: dict, cap: int, result: dict) -> dict:
    """One config's row from rl_step's result: the steady-state medians, each timed step's
    seconds, and the error of a run that did not finish (its partial steps still counted)."""
    summary = result.get("steady") or result.get("summary")
    if not summary:
        return {"config": cfg["name"], "response_len": cap, "error": result.get("error")}
    r = row(cfg, cap, summary, None)
    r["steps_s"] = [s.get("total_s") for s in result.get("steps", [])]
    cut = f"cut after {len(r['steps_s'])} timed step(s)" if result.get("partial") else None
    error = result.get("error") or cut
    return {**r, "error": error} if error else r


def add_ratios(rows: list[dict]) -> list[dict]:
    """Speed-ups within each cap: every row's step and rollout against on-policy bf16 dense; a
    ``+s1`` row's step also against ``dense+s1`` (off-policy against off-policy). A ``+s1``
    rollout column is the step's wait for a rollout generated meanwhile: no rollout ratio."""
    for r in rows:
        cfg = parse_config(r["config"])
        dense = _reference(rows, r["response_len"], stale=False)
        if dense is not None and r is not dense and r.get("step_s"):
            r["step_speedup"] = dense["step_s"] / r["step_s"]
            if not cfg.get("stale"):
                r["rollout_speedup"] = dense["rollout_s"] / r["rollout_s"]
        dense_s1 = _reference(rows, r["response_len"], stale=True)
        if cfg.get("stale") and dense_s1 is not None and r is not dense_s1 and r.get("step_s"):
            r["step_speedup_vs_s1"] = dense_s1["step_s"] / r["step_s"]
    return rows


def _reference(rows: list[dict], cap: int, stale: bool) -> dict | None:
    """The bf16 dense row at ``cap``, on-policy or ``+s1``, if it has a step time."""
    for r in rows:
        cfg = parse_config(r["config"])
        if (r["response_len"] == cap and cfg["compress"] == "none" and not cfg.get("kv_dtype")
                and bool(cfg.get("stale")) == stale and r.get("step_s")):
            return r
    return None


def row(cfg: dict, cap: int, summary: dict, dense: dict | None) -> dict:
    if "error" in summary:
        return {"config": cfg["name"], "response_len": cap, **summary}
    med = {k: v["median"] for k, v in summary.items()}
    r = {"config": cfg["name"], "response_len": cap, **{f"{p}_s": med.get(f"{p}_s") for p in PHASES},
         "step_s": med.get("total_s"), "rollout_tokens_per_s": med.get("rollout_tokens_per_s"),
         "pool_peak_slots": med.get("kv_pool_peak_used"), "pool_slots": med.get("kv_pool_capacity"),
         "preemptions": med.get("rollout_preemptions"), "tail_fraction": med.get("rollout_tail_fraction"),
         "response_len_mean": med.get("response_len_mean"), "spread": summary}
    if med.get("kv_pool_peak_bytes") and r["pool_peak_slots"]:
        r["pool_gib"] = r["pool_slots"] * med["kv_pool_peak_bytes"] / r["pool_peak_slots"] / 2**30
    if dense and dense.get("step_s") and r["step_s"]:
        r["step_speedup"] = dense["step_s"] / r["step_s"]
        r["rollout_speedup"] = dense["rollout_s"] / r["rollout_s"]
    return r


def print_rows(rows: list[dict]) -> None:
    cols = ("config", "response_len", "step_s", "rollout_s", "recompute_s", "update_s", "sync_s",
            "rollout_tokens_per_s", "pool_peak_slots", "preemptions", "tail_fraction",
            "pool_gib", "step_speedup", "rollout_speedup", "step_speedup_vs_s1")
    print(" ".join(f"{c[:12]:>12s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c):>12.4g}" if isinstance(r.get(c), (int, float)) else
                       f"{str(r.get(c)):>12s}" for c in cols))


def plot(rows: list[dict], path: Path) -> None:
    """Stacked step time per configuration, one panel per response length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["response_len"], round(r.get("pool_gib") or 0, 1)) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (cap, gib) in zip(axes[0], panels):
        mine = [r for r in rows if (r["response_len"], round(r.get("pool_gib") or 0, 1)) == (cap, gib)
                and r.get("step_s")]
        bottom = [0.0] * len(mine)
        for phase in PHASES:
            vals = [r.get(f"{phase}_s") or 0.0 for r in mine]
            ax.bar([r["config"] for r in mine], vals, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"{cap}-token cap, {gib:g} GiB KV pool")
        ax.set_ylabel("seconds per RL step")
        ax.tick_params(axis="x", rotation=30)
    axes[0][0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="training/rl_step.py's --shape")
    p.add_argument("--response-len", type=int, nargs="+", default=[4096], help="caps to run")
    p.add_argument("--configs", nargs="+", default=["dense", "rkv:512", "rkv:1024", "snapkv:512",
                                                    "snapkv:1024"])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--dense-fraction", type=float, default=0.25,
                   help="the pool holds this fraction of the batch's dense KV at the cap")
    # reasoning RL runs sit near their cap (verl's DAPO: 20-28k-token means at 20k+ caps): by
    # default the median is half the cap and ~12% of the samples reach it
    p.add_argument("--median-frac", type=float, default=0.5, help="median length / cap")
    p.add_argument("--sigma", type=float, default=0.6, help="log-normal spread of the lengths")
    p.add_argument("--warmup-scale", type=float, default=0.125,
                   help="the warm-up rollout's lengths are scaled by this (compiles, captures)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per config (after a warm-up)")
    p.add_argument("--stale-steps", type=int, default=4,
                   help="timed steps of a +s1 config at least (its steady state: the steps after "
                        "the first)")
    p.add_argument("--max-tokens-per-gpu", type=int, default=0,
                   help="the trainer's micro-batch (0: sized from free memory, its default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="stacked step-time PNG")
    args, extra = p.parse_known_args(argv)
    args.extra = extra
    return args


def result(args, rows: list[dict], partial: bool) -> dict:
    return {"gpu": device_name(), "shape": args.shape, "prompts": args.prompts,
            "samples": args.samples, "dense_fraction": args.dense_fraction,
            "median_frac": args.median_frac, "sigma": args.sigma, "steps": args.steps,
            "stale_steps": args.stale_steps, "partial": partial, "rows": rows}


def run_all(args, configs: list[dict], hf: Path, work: Path) -> list[dict]:
    """Every config at every cap, ``--json`` rewritten after each; stops at SIGTERM."""
    rows: list[dict] = []
    for cap in args.response_len:
        for cfg in configs:
            rows.append(config_row(cfg, cap, run_config(args, cfg, cap, hf, work)))
            add_ratios(rows)
            print_rows([rows[-1]])
            if args.json:
                Path(args.json).write_text(json.dumps(result(args, rows, True), indent=2))
            if CHILDREN.cut:
                return rows
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, CHILDREN.on_term)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-long-rollout-"))
    hf = build_checkpoint(args.shape, work / "hf")
    rows = run_all(args, [parse_config(c) for c in args.configs], hf, work)
    print_rows(rows)
    if args.plot:
        plot(rows, Path(args.plot))
    out = emit(result(args, rows, CHILDREN.cut), args.json)
    if CHILDREN.cut:
        print("[long-rollout] cut by SIGTERM: the rows so far are kept", flush=True)
        sys.exit(CUT_EXIT)
    return out


if __name__ == "__main__":
    main()
