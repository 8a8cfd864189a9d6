"""The documented launches themselves (``scripts/run-*.sh``), on random checkpoints of the model's
shape, with what a user watches: rollouts that lose no sample, the step split, memory per GPU.

    python -m benchmarks.studies.run_scripts --cases 1.5b-rkv-1gpu 1.5b-rkv-dp2 1.5b-rkv-disagg-s1 \\
        --data-dir ../shared/data/train --out runs/run_scripts
    python -m benchmarks.studies.run_scripts --cases 3b-rkv-tp1 3b-rkv-tp2 3b-tp1 3b-tp2 \\
        --gpus 2,3 --out runs/run_scripts_3b          # a second lane on the other two GPUs

Each case runs its script exactly as a user would (``NUM_GPUS``, ``TP``, ``ROLLOUT_GPUS`` in the
environment, extra trainer flags last), ``EVAL_SETS=`` and ``MODEL_DIR`` a random checkpoint of
the case's shape (built once per shape under ``--workdir``). ``--gpus`` picks the GPUs a lane
uses (``CUDA_VISIBLE_DEVICES``), so two lanes can share a 4-GPU host. While a case runs,
``nvidia-smi`` samples every visible GPU's utilization and memory every 200 ms.

Printed per case: rollouts, step seconds (min / median / max of the rollouts after the first),
the median split (rollout wait, recompute, update, sync), ``aborted`` summed over the run (must
be 0), mean response length, KV slots per sample at its peak, the KV pool's peak GiB, and per GPU
the peak memory and mean utilization. JSON per case and ``cases.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks.studies.layouts import GPUSampler

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Case:
    script: str  # under scripts/
    shape: str  # checkpoint_tools.tiny_models.SHAPES
    env: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]


# the reproduction: 32 x 8 samples at 1,024 tokens, 4 rollouts
_SMALL = ("--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--global-batch-size", "256",
          "--rollout-max-response-len", "1024")
# the 3B main job at the largest batch a 10-minute call holds: 16 x 8 samples at 2,048 tokens
_3B = ("--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128",
       "--rollout-max-response-len", "2048")
CASES = {
    "1.5b-rkv-1gpu": Case("run-qwen2.5-1.5b-rkv.sh", "qwen2.5-0.5b", (("NUM_GPUS", "1"),), _SMALL),
    "1.5b-rkv-dp2": Case("run-qwen2.5-1.5b-rkv.sh", "qwen2.5-0.5b", (("NUM_GPUS", "2"),), _SMALL),
    "1.5b-rkv-dp2-s1-proc": Case("run-qwen2.5-1.5b-rkv.sh", "qwen2.5-0.5b", (("NUM_GPUS", "2"),),
                                 _SMALL + ("--max-staleness", "1", "--rollout-engine-process")),
    "1.5b-rkv-disagg-s1": Case("run-qwen2.5-1.5b-rkv.sh", "qwen2.5-0.5b",
                               (("NUM_GPUS", "1"), ("ROLLOUT_GPUS", "1")),
                               _SMALL + ("--max-staleness", "1")),
    "1.5b-rkv-dp4": Case("run-qwen2.5-1.5b-rkv.sh", "qwen2.5-0.5b", (("NUM_GPUS", "4"),), _SMALL),
}
for _tp in (1, 2, 4):
    for _gpus in (2, 4):
        if _tp <= _gpus:
            for _name, _script in (("3b-rkv", "run-qwen2.5-3b-rkv.sh"), ("3b", "run-qwen2.5-3b.sh")):
                _key = f"{_name}-tp{_tp}" + ("" if _gpus == 2 else f"-{_gpus}gpu")
                CASES[_key] = Case(_script, "qwen2.5-3b",
                                   (("NUM_GPUS", str(_gpus)), ("TP", str(_tp))), _3B)


def checkpoint(shape: str, work: Path) -> Path:
    """A random HF checkpoint of ``shape`` (bf16 on a GPU), built once per shape."""
    out = work / "models" / shape
    if not (out / "config.json").exists():
        from benchmarks.common.checkpoint import build_checkpoint

        print(f"[run-scripts] building a random {shape} checkpoint in {out}", flush=True)
        build_checkpoint(shape, out)
    return out


def case_env(case: Case, args, model: Path, save: Path) -> dict:
    env = dict(os.environ, MODEL_DIR=str(model), DATA_DIR=str(args.data_dir), SAVE_DIR=str(save),
               EVAL_SETS="", NUM_ROLLOUT=str(args.rollouts), SAVE_INTERVAL="1000")
    env.update(case.env)
    if args.gpus:
        env["CUDA_VISIBLE_DEVICES"] = args.gpus
    return env


def run_case(name: str, args, work: Path) -> dict:
    case = CASES[name]
    save = work / "runs" / name
    argv = ["bash", str(ROOT / "scripts" / case.script), *case.flags, *args.extra]
    env = case_env(case, args, checkpoint(args.shape or case.shape, work), save)
    print(f"[run-scripts] {name}: {' '.join(f'{k}={v}' for k, v in case.env)} {' '.join(argv[1:])}",
          flush=True)
    with GPUSampler(save.parent / f"{name}-gpu.csv") as gpus:
        done = subprocess.run(argv, env=env, cwd=ROOT)
    rows = read_metrics(save / "logs" / "metrics.jsonl")
    result = {"case": name, "exit": done.returncode, "rollouts": len(rows),
              **summarize(rows), "gpus": gpus.peaks(lane_indices(args.gpus))}
    Path(args.out, f"{name}.json").write_text(json.dumps({**result, "metrics": rows}, indent=2))
    return result


def lane_indices(gpus: str | None) -> list[int] | None:
    """nvidia-smi numbers every GPU of the host whatever CUDA_VISIBLE_DEVICES says: the lane's."""
    return [int(i) for i in gpus.split(",")] if gpus else None


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("step", 0) > 0]


def summarize(rows: list[dict]) -> dict:
    """Steps after the first (start-up and compile in it); ``aborted`` over every rollout."""
    if not rows:
        return {}
    timed = rows[1:] or rows
    med = lambda k: statistics.median(r.get(k, 0.0) for r in timed)  # noqa: E731
    steps = [r["time_total"] for r in timed]
    return {"step_s": steps, "step_median_s": statistics.median(steps),
            **{p: med(f"time_{p}") for p in ("rollout", "recompute", "update", "sync")},
            "aborted": sum(r.get("aborted", 0.0) for r in rows),
            "response_len_mean": statistics.mean(r.get("response_len_mean", 0.0) for r in rows),
            "kv_peak_slots_per_sample": med("kv_peak_slots_per_sample"),
            "kv_pool_peak_gib": max(r.get("kv_pool_peak_bytes", 0.0) for r in rows) / 2**30}


def print_rows(rows: list[dict]) -> None:
    print("| case | exit | rollouts | step s (after the 1st) | median | rollout / recompute / update "
          "/ sync s | aborted | resp len | KV slots/sample | pool peak GiB | per GPU: peak GiB, busy % |")
    print("|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "step_s" not in r:
            print(f"| {r['case']} | {r['exit']} | {r['rollouts']} | no metrics |")
            continue
        gpus = "; ".join(f"{i}: {g['peak_gib']:.1f}, {g['busy']:.0f}" for i, g in r["gpus"].items())
        print(f"| {r['case']} | {r['exit']} | {r['rollouts']} | "
              f"{' / '.join(f'{t:.1f}' for t in r['step_s'])} | {r['step_median_s']:.2f} | "
              f"{r['rollout']:.1f} / {r['recompute']:.1f} / {r['update']:.1f} / {r['sync']:.2f} | "
              f"{r['aborted']:.0f} | {r['response_len_mean']:.0f} | "
              f"{r['kv_peak_slots_per_sample']:.0f} | {r['kv_pool_peak_gib']:.2f} | {gpus or 'n/a'} |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", required=True, choices=sorted(CASES))
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "train")
    p.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES for this lane, e.g. 2,3")
    p.add_argument("--shape", default=None, help="every case on this shape (e.g. tiny on a CPU)")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", default="runs/run_scripts")
    args, extra = p.parse_known_args(argv)
    args.extra = extra
    if not (args.data_dir / "simplelr_qwen_level3to5" / "train.jsonl").exists():
        p.error(f"--data-dir {args.data_dir}: no simplelr_qwen_level3to5/train.jsonl there")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-run-scripts-"))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases:
        rows.append(run_case(name, args, work))
        print_rows(rows)
    Path(args.out, "cases.json").write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
