"""Same seeds, same metrics, wherever the engines run: a short CPU ``trainer.train`` run per
engine placement, in one or two source trees, and the deterministic metrics compared.

    python -m benchmarks.studies.placement_metrics --out runs/placements --tree new=. [--tree old=../old]

Each placement is launched as users launch it (``python -m trainer.train`` in the tree's root,
a tiny random-weight Qwen2.5 from ``checkpoint_tools.tiny_models``, 3 rollouts, a reward that
differs between samples (``reward.py`` written to ``--out``: the response's length mod 3), so
the updates and the pushed weights are not zero):

    inprocess        the in-process engine
    engine-process   --rollout-engine-process (a child ``sglang_kvc.launch_server``)
    server-urls      --rollout-server-urls with a ``launch_server`` started here
    async            --max-staleness 1 on the in-process engine

Timings, throughputs and memory differ from run to run and are left out (``VARYING``); every
other metric of every step must be equal between the trees for a placement (printed as a table,
and as JSON with ``--json``). A refactor that moves code without changing behaviour passes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from trainer.launch import free_port
from trainer.rollout.engines.lifecycle import wait_healthy

PLACEMENTS = {"inprocess": [], "engine-process": ["--rollout-engine-process"],
              "server-urls": ["SERVER"], "async": ["--max-staleness", "1"]}
VARYING = ("time", "tokens_per_s", "memory/", "decode_host_s", "decode_gpu_wait_s",
           "decode_ms_per_step", "graph_capture_s", "rollout_tail_fraction", "sync_bytes_per_s")


def _rows(n: int = 64) -> str:
    rows = []
    for i in range(n):
        a, b = i % 9 + 1, (i * 7) % 7 + 3
        rows.append({"prompt": f"<|im_start|>user\nadd {a} {b}<|im_end|>\n<|im_start|>assistant\n",
                     "label": str(a + b)})
    return "".join(json.dumps(r) + "\n" for r in rows)


REWARD = "def reward(sample):\n    return float(len(sample.response) % 3)\n"


def _flags(hf: Path, data: Path, out: Path) -> list[str]:
    return ["--hf-checkpoint", str(hf), "--prompt-data", str(data), "--log-dir", str(out),
            "--custom-rm-path", f"{data.parent / 'reward.py'}:reward", "--num-rollout", "3",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--global-batch-size", "8", "--rollout-max-response-len", "12", "--lr", "1e-3",
            "--kl-loss-coef", "0", "--max-tokens-per-gpu", "512",
            "--seed", "7", "--sglang-max-total-tokens", "4096", "--reward-workers", "1"]


def _env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'sglang-kvc'}",
            "PYTHONWARNINGS": "ignore"}


def _server(tree: Path, hf: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                             str(hf), "--port", str(port), "--max-total-tokens", "4096"],
                            cwd=tree, env=_env(tree), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    if not wait_healthy([url], 300.0, poll=0.5, health_timeout=1.0):
        return proc, url
    proc.kill()
    raise RuntimeError(f"the server of {tree} did not start")


def run_one(tree: Path, name: str, hf: Path, data: Path, out: Path) -> list[dict]:
    """One placement's run in ``tree``: its metrics rows (cached in ``out``)."""
    metrics = out / "metrics.jsonl"
    if not metrics.is_file():
        server, extra = None, list(PLACEMENTS[name])
        if extra == ["SERVER"]:
            server, url = _server(tree, hf)
            extra = ["--rollout-server-urls", url]
        try:
            proc = subprocess.run([sys.executable, "-m", "trainer.train", *_flags(hf, data, out),
                                   *extra], cwd=tree, env=_env(tree), text=True,
                                  capture_output=True, timeout=1800)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{tree} {name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(s in k for s in VARYING)}


def compare(a: list[dict], b: list[dict]) -> list[str]:
    """Metrics that differ between two runs' steps (none: the same run)."""
    diffs = [f"steps {len(a)} vs {len(b)}"] if len(a) != len(b) else []
    for ra, rb in zip(map(deterministic, a), map(deterministic, b)):
        for k in sorted(set(ra) | set(rb)):
            if ra.get(k) != rb.get(k):
                diffs.append(f"step {ra.get('step')}: {k} {ra.get(k)} vs {rb.get(k)}")
    return diffs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tree", action="append", required=True, help="name=path of a source tree")
    p.add_argument("--placement", nargs="*", default=list(PLACEMENTS), choices=list(PLACEMENTS))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "train.jsonl"
    data.write_text(_rows())
    (args.out / "reward.py").write_text(REWARD)
    hf = args.out / "tiny-qwen2.5"
    if not (hf / "config.json").is_file():
        from checkpoint_tools.tiny_models import make_tiny_model

        make_tiny_model("qwen2.5", hf)
    runs = {(t, n): run_one(Path(path).resolve(), n, hf, data, args.out / t / n)
            for t, path in trees.items() for n in args.placement}
    report = {}
    first, *others = list(trees)
    for n in args.placement:
        base = runs[(first, n)]
        report[n] = {"steps": len(base), "reward_mean": [r["reward_mean"] for r in base],
                     "response_len_mean": [r["response_len_mean"] for r in base],
                     "aborted": [r["aborted"] for r in base],
                     "diffs": {t: compare(base, runs[(t, n)]) for t in others}}
    print(f"{'placement':<16} {'steps':>5} {'reward_mean':>24} {'response_len':>16}  same as")
    for n, r in report.items():
        same = ", ".join(f"{t}: {'yes' if not d else f'NO ({len(d)})'}"
                         for t, d in r["diffs"].items())
        print(f"{n:<16} {r['steps']:>5} {str(r['reward_mean']):>24} "
              f"{str(r['response_len_mean']):>16}  {same or '-'}")
    if args.json:
        print(json.dumps(report, indent=1))
    return 0 if all(not d for r in report.values() for d in r["diffs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
