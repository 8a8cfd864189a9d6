"""The inference frontier (issue 43, item 1): which KV budgets a policy can live under at all,
measured without training. Each checkpoint answers held-out prompts greedily with KV compression
at each budget, against the same checkpoint dense.

    # one GPU call: the warm-up, the correction grid's dense run (60 rollouts), then the frontier
    # of both checkpoints (the warm-up one and the trained one)
    python -m benchmarks.studies.inference_frontier --out runs/frontier --model-dir <SmolLM2 bf16> --train-dense 60
    # HF checkpoints that exist, named
    python -m benchmarks.studies.inference_frontier --out runs/frontier warmup=DIR dense=DIR
    # CPU smoke: a tiny random model (its accuracy means nothing)
    python -m benchmarks.studies.inference_frontier --out /tmp/frontier --model tiny --budgets 24 32 --prompts 8

The prompts are the ones the correction grid's dense eval scores (``correction_grid.eval_file``,
same seed), answered as the trainer's evaluation answers them (its engine backend and grader):
once dense, then for each algorithm x prompt mode x budget. Prompt modes: ``keep`` (the prompt's
KV is never evicted: ``--sglang-compress-keep-prompt``, the budget counts response tokens),
``compress`` (compressed at prefill: ``--sglang-compress-prompt``), ``evict`` (neither: the
prompt is evicted from the first compression on, as in the reference). One engine serves every
budget of an (algorithm, mode), since a request carries its own budget (sglang-kvc's
``compress_budget``); its KV pool is released and re-allocated before each pass, so the pool's
peak is that pass's alone. All prompts go in as one batch, into a pool that holds them all dense
(nothing is preempted).

Per pass: the accuracy (mean reward; ``chain`` credits each right step) ± its s.e. over prompts,
its share of the same checkpoint's dense accuracy, the KV pool peak over dense's, the mean
response length. Out: a markdown table, ``frontier.json``, ``frontier.png`` (accuracy against
pool fraction, a line per checkpoint x algorithm x mode, dense dashed) and a summary: per line,
the smallest budget from which every larger one keeps ``--keep-share`` of dense's accuracy.

With ``--train-dense N`` the trained checkpoint is the grid's dense run (``grid/correction_grid.py run
--configs dense``: the quickstart's warm-up, then N rollouts with the documented grid's flags,
``correction_grid.REAL_MODEL_FLAGS``), exported to HF from its last trainer checkpoint; the
warm-up checkpoint is the one that run started from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import time
from pathlib import Path

from benchmarks.grid import correction_grid as grid

BUDGETS = {"smollm2": (96, 128, 192, 256, 320, 384, 512), "tiny": (24, 32)}
# sglang-kvc's flags of each prompt mode
PROMPT_MODES = {"keep": {"compress_keep_prompt": True}, "compress": {"compress_prompt": True},
                "evict": {}}
PROMPT_WORDS = {"keep": "kept", "compress": "compressed", "evict": "evictable", None: "-"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One greedy pass: dense (no algorithm), or an algorithm at a budget with a prompt mode."""

    algorithm: str | None = None
    budget: int | None = None
    prompt: str | None = None


@dataclasses.dataclass
class Bench:
    """What every checkpoint is measured on, and how."""

    model: str  # tiny | smollm2: the task's prompts, grader, length cap and compression shape
    task: str
    eval_path: Path
    algorithms: tuple[str, ...]
    budgets: tuple[int, ...]
    prompt_modes: tuple[str, ...]
    dtype: str

    @property
    def spec(self):
        from trainer.quickstart import task_of

        return task_of(self.model, self.task)

    def engines(self) -> list[tuple[str | None, str | None]]:
        """(algorithm, prompt mode) of each engine, dense first: it is every row's reference."""
        return [(None, None)] + [(a, m) for a in self.algorithms for m in self.prompt_modes]

    def settings(self, algorithm: str | None, prompt: str | None) -> list[Setting]:
        budgets = self.budgets if algorithm else (None,)
        return [Setting(algorithm, b, prompt) for b in budgets]


# --------------------------------------------------------------------------- one checkpoint

def load_eval_prompts(checkpoint: Path, bench: Bench) -> list:
    """The eval rows as the trainer reads them (chat template applied to message lists)."""
    from transformers import AutoTokenizer

    from trainer.rollout.samples.data import load_prompts

    return load_prompts(str(bench.eval_path), AutoTokenizer.from_pretrained(checkpoint))


def server_args(checkpoint: Path, bench: Bench, prompts: list, algorithm: str | None,
                prompt: str | None):
    """An engine that holds every prompt's whole answer at once: one batch, no preemption."""
    from sglang_kvc import ServerArgs
    from trainer.quickstart import COMPRESS_SHAPE

    longest = max(len(p.input_ids) for p in prompts) + bench.spec.max_len
    values = dict(model_path=str(checkpoint), dtype=bench.dtype, max_running_requests=len(prompts),
                  max_total_tokens=len(prompts) * longest + 64)
    if algorithm:
        divide, window = COMPRESS_SHAPE[bench.model]
        # the server's budget is only the default: every request names its own
        values.update(compress_algorithm=algorithm, compress_max_prompt=max(bench.budgets),
                      compress_divide_length=divide, compress_max_window=window,
                      **PROMPT_MODES[prompt])
    return ServerArgs(**values)


def greedy_pass(engine, prompts: list, rewards, bench: Bench, setting: Setting) -> dict:
    """The prompts answered greedily in one batch, scored; the pool's peak over this pass."""
    from trainer.rollout.engines.inprocess import EngineRollout
    from trainer.rollout.engines.interface import RolloutConfig
    from trainer.rollout.samples.rewards import RewardInput

    engine.release_memory(["kv_cache"])  # a re-allocated pool starts its peak from zero
    engine.resume_memory(["kv_cache"])
    sampling = RolloutConfig(max_response_len=bench.spec.max_len, temperature=0.0,
                             compress_budget=setting.budget)
    begin = time.perf_counter()
    gens = EngineRollout(engine).generate([p.input_ids for p in prompts], 1, sampling)
    seconds = time.perf_counter() - begin
    scores = rewards.score([RewardInput(p.text, g.text, p.label, p.metadata)
                            for p, g in zip(prompts, gens)])
    return pass_row(setting, scores, gens, engine.get_server_info()["kv_pool"]["peak_used"], seconds)


def pass_row(setting: Setting, scores: list[float], gens: list, pool_peak: int,
             seconds: float) -> dict:
    accuracy, se = grid.mean_se(scores)
    return {"algorithm": setting.algorithm or "dense", "budget": setting.budget,
            "prompt": setting.prompt, "accuracy": accuracy, "se": se, "prompts": len(scores),
            "response_len": sum(len(g.response_ids) for g in gens) / len(gens),
            "truncated": sum(g.finish_reason == "length" for g in gens) / len(gens),
            "preemptions": sum(g.meta.get("num_preemptions", 0) for g in gens),
            "pool_peak": pool_peak, "seconds": seconds}


def relate(row: dict, dense: dict) -> dict:
    """The row against its checkpoint's dense pass: accuracy share and pool fraction."""
    share = row["accuracy"] / dense["accuracy"] if dense["accuracy"] else math.nan
    return {**row, "of_dense": share, "pool_fraction": row["pool_peak"] / dense["pool_peak"]}


def pool_bound(prompts: list, bench: Bench, setting: Setting) -> int:
    """The most slots the pass can hold (the engine's admission bound, summed over prompts):
    prompt + cap dense; compressed max(P + 1, B + N), or P + B + N with the prompt kept."""
    from trainer.quickstart import COMPRESS_SHAPE
    from trainer.rollout.engines.capacity import slots_per_sample

    divide = COMPRESS_SHAPE[bench.model][0] if setting.algorithm else None
    return sum(slots_per_sample(len(p.input_ids), bench.spec.max_len, setting.budget, divide,
                                setting.prompt == "keep") for p in prompts)


def checkpoint_frontier(name: str, checkpoint: Path, bench: Bench, rewards, record) -> None:
    """Every setting of one checkpoint, an engine per (algorithm, prompt mode) in turn; each
    row goes to ``record`` as soon as it is measured."""
    from sglang_kvc import Engine

    prompts, dense = load_eval_prompts(checkpoint, bench), None
    lengths = [len(p.input_ids) for p in prompts]
    for algorithm, mode in bench.engines():
        with Engine(server_args=server_args(checkpoint, bench, prompts, algorithm, mode)) as engine:
            for setting in bench.settings(algorithm, mode):
                row = greedy_pass(engine, prompts, rewards, bench, setting)
                dense = dense or row  # the engines' first pass is dense
                record({"checkpoint": name, **relate(row, dense), "prompt_tokens": sum(lengths),
                        "prompt_tokens_max": max(lengths),
                        "pool_bound": pool_bound(prompts, bench, setting)})


# --------------------------------------------------------------------------- the dense run

def train_dense(args) -> dict[str, Path]:
    """The grid's dense run (its warm-up, then ``--train-dense`` rollouts), and the checkpoints
    to measure: the one it started from and its last, exported to HF."""
    argv = ["run", "--out", str(args.out / "train"), "--configs", "dense", "--seeds", str(args.seed),
            "--model", args.model, "--task", args.task, "--num-rollout", str(args.train_dense),
            "--parallel", "1", "--eval-interval", str(args.train_eval_interval or args.train_dense),
            "--eval-prompts", str(args.prompts), "--eval-seed", str(args.eval_seed),
            "--poll", str(args.poll)]
    argv += ["--model-dir", str(args.model_dir)] if args.model_dir else []
    if grid.main(argv + ["--", *args.train_flags]):
        raise SystemExit("inference_frontier: the dense run failed (see <out>/train/*/run.log)")
    folder = dense_run_folder(args)
    # the trained policy first: the one the frontier is mostly about, if the time runs out
    return {"dense": export_hf(folder), "warmup": start_checkpoint(folder / "ckpt")}


def dense_run_folder(args) -> Path:
    return args.out / "train" / grid.parse_config("dense", args.seed).name


def start_checkpoint(ckpt: Path) -> Path:
    """The HF checkpoint a trainer run started from (its ``--hf-checkpoint``, saved with it):
    the quickstart's warm-up."""
    from checkpoint_tools.torch_dist import read_common, resolve_checkpoint_dir

    path = Path(read_common(resolve_checkpoint_dir(ckpt))["args"].hf_checkpoint)
    return path if path.is_absolute() else grid.ROOT / path  # the grid runs from the root


def export_hf(folder: Path) -> Path:
    """The run's last trainer checkpoint as an HF directory (``folder/hf``), with the tokenizer
    and chat template of the checkpoint it started from."""
    from checkpoint_tools.megatron2hf import convert_torch_dist_to_hf

    return convert_torch_dist_to_hf(folder / "ckpt", folder / "hf", overwrite=True, progress=False,
                                    origin_hf_dir=start_checkpoint(folder / "ckpt"))


def training_evals(args) -> dict:
    """The dense run's own greedy evals of the same prompts, before training and at its end:
    the frontier's dense rows should match them."""
    run = grid.RunResult(grid.parse_config("dense", args.seed), grid.read_rows(dense_run_folder(args)))
    points = run.series(run.eval_key(args.task, "0", True, "score"))
    return {"warmup": points[0][1], "dense": points[-1][1]} if points else {}


# --------------------------------------------------------------------------- report

HEAD = ["checkpoint", "algorithm", "budget", "prompt", "accuracy ± s.e.", "of dense",
        "pool peak of dense's", "mean response tokens"]


def table(rows: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in rows:
        cells = [r["checkpoint"], r["algorithm"], "-" if r["budget"] is None else str(r["budget"]),
                 PROMPT_WORDS[r["prompt"]], grid.fmt_mean_se(r["accuracy"], r["se"]),
                 "-" if math.isnan(r["of_dense"]) else f"{r['of_dense']:.0%}",
                 f"{r['pool_fraction']:.2f}", f"{r['response_len']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def lines_of(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The compressed rows by (checkpoint, algorithm, prompt mode), in budget order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["budget"] is not None:
            out.setdefault((r["checkpoint"], r["algorithm"], r["prompt"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["budget"]) for k, v in out.items()}


def smallest_living_budget(line: list[dict], share: float) -> dict | None:
    """The smallest budget from which every larger budget keeps ``share`` of dense's accuracy."""
    found = None
    for r in reversed(line):
        if not r["of_dense"] >= share:  # NaN (dense scored 0) never lives
            break
        found = r
    return found


def summary(rows: list[dict], share: float, trained: dict | None = None) -> list[str]:
    out = []
    for r in (r for r in rows if r["budget"] is None):
        seen = f"; its training run's own eval said {trained[r['checkpoint']]:.3f}" \
            if trained and r["checkpoint"] in trained else ""
        out.append(f"{r['checkpoint']}: dense {grid.fmt_mean_se(r['accuracy'], r['se'])}, pool peak "
                   f"{r['pool_peak']} slots{seen}")
    for (name, algorithm, prompt), line in lines_of(rows).items():
        best = smallest_living_budget(line, share)
        where = (f"budget >= {best['budget']} ({best['of_dense']:.0%} of dense, pool "
                 f"{best['pool_fraction']:.2f} of dense's)" if best else
                 f"no budget up to {line[-1]['budget']}")
        out.append(f"{name} {algorithm}, prompt {PROMPT_WORDS[prompt]}: keeps {share:.0%} of dense "
                   f"at {where}")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["checkpoint"] for r in rows))
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 6))
    for r in (r for r in rows if r["budget"] is None):
        ax.axhline(r["accuracy"], color=colors[r["checkpoint"]], linestyle="--", linewidth=1,
                   label=f"{r['checkpoint']} dense")
        ax.plot([1.0], [r["accuracy"]], marker="*", markersize=9, color=colors[r["checkpoint"]])
    for (name, algorithm, prompt), line in lines_of(rows).items():
        _plot_line(ax, line, colors[name], f"{name} {algorithm}, prompt {PROMPT_WORDS[prompt]}")
    ax.set_xlabel("KV pool peak, of dense's (same prompts)")
    ax.set_ylabel("greedy accuracy (± s.e. over prompts)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


MARKERS = {"rkv": "o", "snapkv": "s", "streamingllm": "^"}
STYLES = {"keep": "-", "compress": ":", "evict": "-."}


def _plot_line(ax, line: list[dict], color, label: str) -> None:
    xs, ys = [r["pool_fraction"] for r in line], [r["accuracy"] for r in line]
    ax.errorbar(xs, ys, yerr=[0.0 if math.isnan(r["se"]) else r["se"] for r in line], color=color,
                marker=MARKERS.get(line[0]["algorithm"], "x"), linestyle=STYLES[line[0]["prompt"]],
                markersize=4, capsize=2, linewidth=1, label=label)
    for r in line:  # each point's budget, small
        ax.annotate(str(r["budget"]), (r["pool_fraction"], r["accuracy"]), fontsize=6,
                    xytext=(2, 2), textcoords="offset points")


# --------------------------------------------------------------------------- CLI

def parse_checkpoints(specs: list[str]) -> dict[str, Path]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or name in out or not (Path(path) / "config.json").is_file():
            raise ValueError(f"{spec!r}: expected NAME=DIR, NAME new and DIR an HF checkpoint")
        out[name] = Path(path)
    return out


def checkpoints(args) -> dict[str, Path]:
    """The named checkpoints, then the dense run's two, or else a tiny random model."""
    named = parse_checkpoints(args.checkpoints)
    if args.train_dense:
        named.update(train_dense(args))
    elif not named and args.model == "tiny":
        from trainer.quickstart import build_model

        named["tiny"] = build_model(args.out / "tiny-model", args.seed)
    return named


class Progress:
    """One line per pass, as it ends: where the run is and what the pass measured."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.time()

    def __call__(self, r: dict) -> None:
        self.done += 1
        what = "dense KV" if r["budget"] is None else \
            f"{r['algorithm']} {r['budget']} prompt {PROMPT_WORDS[r['prompt']]}"
        print(f"[frontier +{time.time() - self.start:.0f}s {self.done}/{self.total}] "
              f"{r['checkpoint']} {what}: accuracy {grid.fmt_mean_se(r['accuracy'], r['se'])}, "
              f"pool {r['pool_fraction']:.2f} of dense's ({r['pool_peak']} slots), "
              f"{r['response_len']:.0f} tokens, {r['seconds']:.1f}s", flush=True)


def make_bench(args) -> Bench:
    import torch

    evals = grid.eval_file(args.out, args.model, args.task, args.prompts, args.eval_seed)
    # the quickstart's engine dtype: what the trainer's own evaluation runs in
    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    return Bench(args.model, args.task, evals, tuple(args.algorithms),
                 tuple(args.budgets or BUDGETS[args.model]), tuple(args.prompt_modes), dtype)


def run(args) -> int:
    from trainer.rollout.samples.rewards import RewardConfig, RewardModel

    args.out.mkdir(parents=True, exist_ok=True)
    todo = checkpoints(args)
    bench = make_bench(args)
    progress, rows = Progress(len(todo) * sum(len(bench.settings(*e)) for e in bench.engines())), []

    def record(row: dict) -> None:  # the JSON after every pass: a run cut short keeps its rows
        rows.append(row)
        progress(row)
        write_json(args, bench, todo, rows)

    with RewardModel(RewardConfig(rm_type=bench.spec.rm_type)) as rewards:
        for name, path in todo.items():
            checkpoint_frontier(name, path, bench, rewards, record)
    finish(args, bench, todo, rows)
    print(f"[frontier] {len(rows)} passes in {time.time() - progress.start:.0f}s")
    return 0


def finish(args, bench: Bench, todo: dict, rows: list[dict]) -> None:
    """The JSON with the dense run's own evals beside, the plot, the table and the summary."""
    trained = training_evals(args) if args.train_dense else None
    write_json(args, bench, todo, rows, trained)
    plot(rows, args.plot or args.out / "frontier.png")
    print("\n".join(table(rows)))
    print("\n".join(f"[frontier] {line}" for line in summary(rows, args.keep_share, trained)))
    print(f"[frontier] wrote {args.json or args.out / 'frontier.json'}, "
          f"{args.plot or args.out / 'frontier.png'}")


def write_json(args, bench: Bench, todo: dict, rows: list[dict], trained: dict | None = None) -> None:
    """The rows, with what they were measured on."""
    meta = {"model": bench.model, "task": bench.task, "eval_file": str(bench.eval_path),
            "eval_seed": args.eval_seed, "dtype": bench.dtype, "max_response_len": bench.spec.max_len,
            "checkpoints": {k: str(v) for k, v in todo.items()}, "training_evals": trained}
    path = args.json or args.out / "frontier.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


def main(argv=None) -> int:
    return run(parse_args(argv))


def parse_args(argv=None) -> argparse.Namespace:
    from trainer.quickstart import COMPRESS_SHAPE

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("checkpoints", nargs="*", metavar="NAME=DIR", help="HF checkpoints to measure")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"],
                   help="whose task, length cap and compression shape (trainer.quickstart)")
    p.add_argument("--model-dir", type=Path, default=None, help="--train-dense: the base model")
    p.add_argument("--task", default=None, help="smollm2: chain (default) or arith; tiny: its own, arith")
    p.add_argument("--train-dense", type=int, default=0, metavar="N",
                   help="first train dense for N rollouts (the grid's dense run) and measure its "
                        "warm-up and final checkpoints too")
    p.add_argument("--train-flags", default=None, help="trainer flags of that run, one string "
                   "(default: correction_grid.REAL_MODEL_FLAGS for smollm2, none for tiny)")
    p.add_argument("--train-eval-interval", type=int, default=None,
                   help="its evals (default: before training and at the end only)")
    p.add_argument("--seed", type=int, default=1, help="its seed (and the tiny model's)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between its progress lines")
    p.add_argument("--algorithms", nargs="+", default=["rkv", "snapkv"])
    p.add_argument("--budgets", type=int, nargs="+", default=None,
                   help=f"default: {' '.join(map(str, BUDGETS['smollm2']))} (tiny: "
                        f"{' '.join(map(str, BUDGETS['tiny']))})")
    p.add_argument("--prompt-modes", nargs="+", default=["keep", "compress"], choices=list(PROMPT_MODES))
    p.add_argument("--prompts", type=int, default=64, help="held-out prompts (the grid's --eval-prompts)")
    p.add_argument("--eval-seed", type=int, default=999_999, help="the grid's --eval-seed")
    p.add_argument("--keep-share", type=float, default=0.9, help="the summary's bar: this share of "
                   "dense's accuracy")
    p.add_argument("--dtype", default=None, help="the engines' (default: bf16 on a GPU, else fp32)")
    p.add_argument("--json", type=Path, default=None, help="default: <out>/frontier.json")
    p.add_argument("--plot", type=Path, default=None, help="default: <out>/frontier.png")
    args = p.parse_args(argv)
    args.out = args.out.resolve()  # the dense run's folders are named to subprocesses
    args.task = args.task or ("arith" if args.model == "tiny" else "chain")  # as the quickstart names them
    if args.model == "tiny" and args.task != "arith":
        p.error("--task is for --model smollm2 (the tiny model has its own task, arith)")
    try:
        parse_checkpoints(args.checkpoints)
    except ValueError as e:
        p.error(str(e))
    if not (args.checkpoints or args.train_dense or args.model == "tiny"):
        p.error("name checkpoints (NAME=DIR) or --train-dense N (or --model tiny: a random one)")
    window = COMPRESS_SHAPE[args.model][1]
    if args.budgets and min(args.budgets) <= window:  # the engine would refuse every request
        p.error(f"--budgets: each must be larger than the observation window ({window})")
    default = grid.REAL_MODEL_FLAGS if args.model == "smollm2" else ()
    args.train_flags = list(default) if args.train_flags is None else shlex.split(args.train_flags)
    return args


if __name__ == "__main__":
    raise SystemExit(main())
