"""Every engine placement on two GPUs, launched as users launch it, in one or more source trees:
does each still lose no sample, generate the expected lengths and step at the same speed?

    python -m benchmarks.studies.engine_placements --tree new=. --tree old=../old --out runs/placements

Placements (issue 47), each through ``scripts/run-qwen2.5-1.5b-rkv.sh`` of the tree (R-KV
rollouts), on a random ``--shape`` checkpoint built once, ``--rollouts`` rollouts:

    colocated        NUM_GPUS=2: an in-process engine on each trainer GPU
    engine-process   NUM_GPUS=2 --rollout-engine-process --max-staleness 1
    disaggregated    NUM_GPUS=1 ROLLOUT_GPUS=1 --max-staleness 1 (an engine process on GPU 1)
    server-urls      NUM_GPUS=1 on GPU 0, --rollout-server-urls of a ``launch_server`` on GPU 1
                     started here with the script's own ``--sglang-*`` flags
    ray              RAY=1 NUM_GPUS=2 (python -m trainer.ray_job, engines colocated)

The trees run placement by placement, each tree in turn, so drift over the call hits both alike.
Printed per (placement, tree): exit code, rollouts, ``aborted`` summed (must be 0), mean response
length, step seconds after the first (min / median / max) and the median phase split; then JSON
(``--out``/placements.json). Placements whose launcher is missing (Ray) show their exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.studies.run_scripts import read_metrics, summarize

from trainer.launch import free_port
from trainer.rollout.engines.lifecycle import wait_healthy

SCRIPT = "run-qwen2.5-1.5b-rkv.sh"
DATA_NAME = "simplelr_qwen_level3to5"  # the script's training set under DATA_DIR
_S1 = ("--max-staleness", "1")
PLACEMENTS = {  # (environment, extra trainer flags)
    "colocated": ({"NUM_GPUS": "2"}, ()),
    "engine-process": ({"NUM_GPUS": "2"}, ("--rollout-engine-process", *_S1)),
    "disaggregated": ({"NUM_GPUS": "1", "ROLLOUT_GPUS": "1"}, _S1),
    "server-urls": ({"NUM_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, ()),  # + the server's URL
    "ray": ({"RAY": "1", "NUM_GPUS": "2"}, ()),
}
SERVER_GPU = "1"


def batch_flags(args) -> list[str]:
    n = args.samples
    return ["--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(n),
            "--global-batch-size", str(args.prompts * n), "--rollout-max-response-len",
            str(args.response_len), "--seed", "1234"]


def tree_env(tree: Path, model: Path, data: Path, save: Path, env: dict, rollouts: int) -> dict:
    """The user's environment for the tree's run script (its own sglang-kvc first; its .venv's
    Python where it has one, as the script picks, else this one)."""
    venv = tree / ".venv" / "bin" / "python"
    python = str(venv) if venv.is_file() else os.environ.get("PYTHON", sys.executable)
    return dict(os.environ, MODEL_DIR=str(model), DATA_DIR=str(data), SAVE_DIR=str(save),
                EVAL_SETS="", NUM_ROLLOUT=str(rollouts), SAVE_INTERVAL="1000", PYTHON=python,
                TORCHRUN=os.environ.get("TORCHRUN", f"{python} -m torch.distributed.run"),
                PYTHONPATH=str(tree / "sglang-kvc"), **env)


def engine_flags(tree: Path, env: dict, flags: list[str]) -> list[str]:
    """The script's ``--sglang-*`` flags (a dry run), as ``launch_server`` flags."""
    out = subprocess.run(["bash", str(tree / "scripts" / SCRIPT), *flags], cwd=tree, text=True,
                         env={**env, "DRY_RUN": "1"}, capture_output=True, check=True)
    argv, picked = shlex.split(out.stdout.strip().splitlines()[-1]), []
    for i, word in enumerate(argv):
        if word.startswith("--sglang-"):
            picked.append("--" + word[len("--sglang-"):])
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                picked.append(argv[i + 1])
    return picked


def _exited(proc: subprocess.Popen, log: Path):
    """wait_healthy's check: a server that exited while starting ends the wait at once."""
    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"launch_server exited while starting (log: {log})")
    return check


def start_server(tree: Path, model: Path, env: dict, flags: list[str], log: Path, timeout=600.0):
    """``python -m sglang_kvc.launch_server`` of ``tree`` on GPU ``SERVER_GPU``; its URL."""
    port = free_port()
    proc = subprocess.Popen([env["PYTHON"], "-m", "sglang_kvc.launch_server", "--model-path",
                             str(model), "--port", str(port), *flags], cwd=tree,
                            env={**env, "CUDA_VISIBLE_DEVICES": SERVER_GPU},
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if proc.poll() is None and not wait_healthy([url], timeout, poll=0.5, check=_exited(proc, log)):
        return proc, url
    proc.kill()
    raise RuntimeError(f"launch_server did not come up (log: {log})")


def run_placement(name: str, tree_name: str, tree: Path, args, model: Path) -> dict:
    env_extra, flags = PLACEMENTS[name]
    save = args.out / tree_name / name
    env = tree_env(tree, model, args.data, save, env_extra, args.rollouts)
    flags, server = [*batch_flags(args), *flags], None
    begin = time.monotonic()
    try:
        if name == "server-urls":
            server, url = start_server(tree, model, env, engine_flags(tree, env, flags),
                                       args.out / f"{tree_name}-server.log")
            flags += ["--rollout-server-urls", url]
        with (args.out / f"{tree_name}-{name}.log").open("w") as log:
            code = subprocess.run(["bash", str(tree / "scripts" / SCRIPT), *flags], cwd=tree,
                                  env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    rows = read_metrics(save / "logs" / "metrics.jsonl")
    return {"placement": name, "tree": tree_name, "exit": code, "rollouts": len(rows),
            "wall_s": time.monotonic() - begin, **summarize(rows)}


def print_table(results: list[dict]) -> None:
    print("| placement | tree | exit | rollouts | aborted | resp len | step s after the 1st | "
          "median | rollout / recompute / update / sync s | wall s |")
    print("|---|---|---:|---:|---:|---:|---|---:|---|---:|")
    for r in results:
        if "step_s" not in r:
            print(f"| {r['placement']} | {r['tree']} | {r['exit']} | {r['rollouts']} | no metrics "
                  f"| | | | | {r['wall_s']:.0f} |")
            continue
        print(f"| {r['placement']} | {r['tree']} | {r['exit']} | {r['rollouts']} | "
              f"{r['aborted']:.0f} | {r['response_len_mean']:.1f} | "
              f"{' / '.join(f'{t:.2f}' for t in r['step_s'])} | {r['step_median_s']:.2f} | "
              f"{r['rollout']:.2f} / {r['recompute']:.2f} / {r['update']:.2f} / {r['sync']:.2f} | "
              f"{r['wall_s']:.0f} |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", required=True, help="name=path of a source tree")
    p.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=list(PLACEMENTS))
    p.add_argument("--shape", default="smollm2-135m", help="training/rl_step.py's shapes")
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--response-len", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("runs/placements"))
    args = p.parse_args(argv)
    args.trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)}
    args.out = args.out.resolve()
    return args


def main(argv=None) -> int:
    from benchmarks.common.checkpoint import build_checkpoint
    from benchmarks.training.rl_step import write_prompts

    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="engine-placements-"))
    model = build_checkpoint(args.shape, work / "model")
    args.data = work / "data"
    (args.data / DATA_NAME).mkdir(parents=True)
    write_prompts(args.data / DATA_NAME / "train.jsonl", args.prompts * (args.rollouts + 1), 1234)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.placements:
        for tree_name, tree in args.trees.items():
            results.append(run_placement(name, tree_name, tree, args, model))
            print_table(results)
            print(flush=True)
    (args.out / "placements.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0 if all(r["exit"] == 0 and r.get("aborted", 1) == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
