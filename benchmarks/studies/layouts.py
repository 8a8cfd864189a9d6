"""The RL step in every layout a user with a few GPUs would pick, against one-GPU sync, in one call.

    python -m benchmarks.studies.layouts --layouts 1gpu-sync coloc-dp2-sync disagg-s1 \\
        --configs rkv:512 dense --response-len 4096 --dense-fraction 0.1 --steps 3 --out runs/layouts

Each (config, layout) is ``training/rl_step.py`` launched the way users launch the trainer
(``torch.distributed.run`` with ``--nproc-per-node`` trainer GPUs, the layout's flags), on one
random ``--shape`` checkpoint imported to torch_dist once, the long-tailed lengths of
``long_rollout.py`` and the same KV pool per engine. While each runs, ``nvidia-smi``
samples every GPU's utilization every 200 ms (``GPU busy``: the mean over the run's measured
steps). Printed per run: step seconds min / median / max, steps per hour, speed against the
config's ``1gpu-sync`` (median step ratio, and the ratio of the summed steps), the phase split,
generation tokens/s, the reward. Each run's JSON lands in ``--out``.

Layouts (``LAYOUTS``): trainer GPUs and extra trainer flags. ``disagg-*`` put the trainer on
GPU 0 and an engine process on each GPU after it (``--rollout-num-gpus``: NCCL weight push).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.checkpoint import build_checkpoint
from benchmarks.common.layouts import LAYOUTS, Layout, launcher
from benchmarks.common.runs import prepare_run_dir
from benchmarks.studies.long_rollout import config_argv, parse_config, pool_tokens

ROOT = Path(__file__).resolve().parents[2]


def prompts_for(args, layout: Layout) -> int:
    """--weak-scaling: the same prompts per generating GPU as one GPU has (else the same batch)."""
    return args.prompts * (layout.generating_gpus if args.weak_scaling else 1)


def run_argv(args, cfg: dict, layout: Layout, hf: Path, out: Path, work: Path) -> list[str]:
    """torchrun over training/rl_step.py with the config's and the layout's flags (the layout's
    after the shared pool size). A full-GPU engine's pool holds its share of the batch at the
    cap; otherwise every engine has one GPU's pool (--dense-fraction), also under --weak-scaling."""
    scaled = argparse.Namespace(**{**vars(args), "prompts": prompts_for(args, layout)})
    pool = (-(-scaled.prompts * args.samples * (args.response_len + 64) // layout.engine_gpus)
            if layout.full_gpu else pool_tokens(args, args.response_len))
    more = ("--sglang-max-total-tokens", str(pool), *layout.flags)
    return config_argv(scaled, cfg, args.response_len, hf, out, work, launcher(layout), more)


def visible_gpus() -> list[int] | None:
    """nvidia-smi numbers every GPU of the host: the ones CUDA_VISIBLE_DEVICES leaves this run
    (None: all), so a run sharing the host with another reports only its own GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else None


class GPUSampler:
    """``nvidia-smi`` utilization and memory of every GPU every 200 ms, in the background."""

    def __init__(self, path: Path):
        self.path = path
        self.proc = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=self.path.open("w"), stderr=subprocess.DEVNULL)
        except FileNotFoundError:  # no GPU here: no utilization column
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def samples(self):
        """(wall-clock time, GPU index, utilization %, memory MiB) per line."""
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            stamp, index, util, mem = (x.strip() for x in line.split(","))
            t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S"))
            yield t, int(index), float(util), float(mem)

    def busy(self, start: float, end: float, indices: list[int] | None = None) -> dict[int, float]:
        """Mean utilization (%) per GPU (those of ``indices``; default all) between two times."""
        per: dict[int, list[float]] = {}
        for t, index, util, _ in self.samples():
            if start <= t <= end and (indices is None or index in indices):
                per.setdefault(index, []).append(util)
        return {i: statistics.mean(v) for i, v in sorted(per.items())}

    def peaks(self, indices: list[int] | None = None) -> dict[int, dict]:
        """Per GPU (those of ``indices``; default all): peak memory GiB and mean utilization %."""
        per: dict[int, list[tuple[float, float]]] = {}
        for _, index, util, mem in self.samples():
            if indices is None or index in indices:
                per.setdefault(index, []).append((util, mem))
        return {i: {"peak_gib": max(m for _, m in v) / 1024, "busy": statistics.mean(u for u, _ in v)}
                for i, v in sorted(per.items())}


def run_one(args, cfg: dict, name: str, hf: Path, work: Path) -> dict:
    layout = LAYOUTS[name]
    tag = f"{cfg['name'].replace(':', '_')}-{name}"
    run_dir, out = work / tag, Path(args.out) / f"{tag}.json"
    prepare_run_dir(run_dir, hf, work)
    argv = run_argv(args, cfg, layout, hf, out, run_dir)
    print(f"[layouts] {tag}: {' '.join(argv[1:])}", flush=True)
    with GPUSampler(run_dir / "gpu_util.csv") as gpus:
        done = subprocess.run(argv, cwd=ROOT)
    if done.returncode != 0 or not out.exists():
        return {"config": cfg["name"], "layout": name, "error": f"exit {done.returncode}"}
    return summarize(cfg, name, json.loads(out.read_text()), gpus)


def summarize(cfg: dict, name: str, result: dict, gpus: GPUSampler) -> dict:
    steps = result["steps"]
    totals = [s["total_s"] for s in steps]
    med = lambda k: statistics.median(s.get(k, 0.0) for s in steps)  # noqa: E731
    span = (steps[0].get("started_at", 0.0), steps[-1].get("ended_at", 0.0))
    return {"config": cfg["name"], "layout": name, "gpus": LAYOUTS[name].gpus,
            "step_s": totals, "step_median_s": statistics.median(totals),
            "steps_per_hour": 3600 / statistics.median(totals), "prompts": result.get("prompts"),
            **{f"{p}_s": med(f"{p}_s") for p in ("rollout", "recompute", "update", "sync")},
            "tokens_per_s": med("rollout_tokens_per_s"), "reward": [s.get("reward_mean") for s in steps],
            "aborted": sum(s.get("aborted", 0.0) for s in steps),
            "gpu_busy": gpus.busy(*span, visible_gpus()) if span[1] else {}}


def with_speedups(rows: list[dict]) -> list[dict]:
    base = {r["config"]: r for r in rows if r["layout"] == "1gpu-sync" and "error" not in r}
    for r in rows:
        b = base.get(r["config"])
        if b and "error" not in r:
            r["vs_1gpu_median"] = b["step_median_s"] / r["step_median_s"]
            r["vs_1gpu_sum"] = sum(b["step_s"]) / sum(r["step_s"])
            # samples per hour against one GPU's (the batches differ under --weak-scaling), and
            # the rollout phase's weak-scaling efficiency (1 = each GPU generates as fast as one)
            scale = (r.get("prompts") or 1) / (b.get("prompts") or 1)
            r["vs_1gpu_samples"] = scale * r["vs_1gpu_median"]
            r["rollout_weak_efficiency"] = b["rollout_s"] / r["rollout_s"] if scale > 1 else None
    return rows


def print_rows(rows: list[dict]) -> None:
    print("| config | layout | GPUs | steps s | median | steps/h | vs 1-GPU sync (median; sum) | "
          "rollout wait s | recompute s | update s | sync s | gen tok/s | GPU busy % | aborted |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['config']} | {r['layout']} | | {r['error']} |")
            continue
        busy = " / ".join(f"{v:.0f}" for v in r["gpu_busy"].values()) or "n/a"
        print(f"| {r['config']} | {r['layout']} | {r['gpus']} | "
              f"{' / '.join(f'{t:.1f}' for t in r['step_s'])} | {r['step_median_s']:.2f} | "
              f"{r['steps_per_hour']:.0f} | {r.get('vs_1gpu_median', 0):.2f}x; "
              f"{r.get('vs_1gpu_sum', 0):.2f}x | {r.get('vs_1gpu_samples', 0):.2f}x | {r['rollout_s']:.2f} | {r['recompute_s']:.2f} | "
              f"{r['update_s']:.2f} | {r['sync_s']:.2f} | {r['tokens_per_s']:.0f} | {busy} | "
              f"{r['aborted']:.0f} |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=["1gpu-sync", "coloc-dp2-sync", "disagg-s1"],
                   choices=sorted(LAYOUTS))
    p.add_argument("--configs", nargs="+", default=["rkv:512"], help="dense or algo:budget")
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--hf-checkpoint", default=None, help="default: a random --shape checkpoint")
    p.add_argument("--response-len", type=int, default=4096)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--dense-fraction", type=float, default=0.1)
    p.add_argument("--median-frac", type=float, default=0.5)
    p.add_argument("--sigma", type=float, default=0.6)
    p.add_argument("--warmup-scale", type=float, default=0.125)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--weak-scaling", action="store_true",
                   help="--prompts per generating GPU (the rollout's weak scaling), not per run")
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default="runs/layouts", help="per-run JSONs and layouts.json")
    args, extra = p.parse_known_args(argv)
    args.extra = extra
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-layouts-"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    hf = Path(args.hf_checkpoint) if args.hf_checkpoint else build_checkpoint(args.shape, work / "hf")
    rows = []
    for spec in args.configs:
        cfg = parse_config(spec)
        for name in args.layouts:
            rows.append(run_one(args, cfg, name, hf, work))
            print_rows(with_speedups(list(rows)))
    rows = with_speedups(rows)
    print_rows(rows)
    (Path(args.out) / "layouts.json").write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
