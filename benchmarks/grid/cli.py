"""``correction_grid.py wave`` and ``poll``: the paired grid's waves (``waves.py``) from the
command line: the checks of the flags, ``--plan``, ``--detach``, the foreground supervisor."""

from __future__ import annotations

import os
import shlex
import sys

from benchmarks.grid import agent_wave, supervisor
from benchmarks.grid import waves


def wave_of(args, parser) -> waves.Wave:
    agent = agent_wave.agent_wave(args.number)
    if args.smoke:
        return agent_wave.SMOKE if agent else waves.SMOKE
    if agent:
        return agent
    if not args.number.isdigit() or int(args.number) not in waves.WAVES:
        parser.error(f"wave {args.number!r}: choose one of {', '.join(map(str, waves.WAVES))}, "
                     f"{agent_wave.NAMES[0]} (or --smoke)")
    return waves.WAVES[int(args.number)]


def apply_smoke(args) -> None:
    """The CPU smoke's sizes (tiny model: its own task, no GPU, two runs at a time)."""
    args.model, args.seeds, args.num_rollout, args.eval_prompts = "tiny", [1, 2], 2, 4
    args.per_gpu, args.gpus, args.save_interval, args.warmup_steps = 2, [], 0, args.warmup_steps or 20
    args.eval_interval = 0 if args.eval_interval is None else args.eval_interval


def apply_wave_defaults(args, wave: waves.Wave) -> None:
    """--num-rollout and --eval-interval left unset: the wave's."""
    if args.num_rollout is None:
        args.num_rollout = wave.num_rollout
    if args.eval_interval is None:
        args.eval_interval = wave.eval_interval


def check(args, parser) -> None:
    from trainer.algorithms.settings import PRESETS

    if args.best_correction not in PRESETS:
        parser.error(f"--best-correction {args.best_correction!r}: choose one of {', '.join(sorted(PRESETS))}")
    best = args.best.split(":")
    if len(best) != 2 or not best[1].isdigit():
        parser.error(f"--best {args.best!r}: expected ALGORITHM:BUDGET, e.g. rkv:128")
    for flag in ("num_rollout", "eval_prompts", "per_gpu"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds: each seed once")
    try:
        prefix = shlex.split(args.prefix_sharing)
    except ValueError as e:
        parser.error(f"--prefix-sharing: {e}")
    args.variant_flags = {**waves.VARIANTS, "prefix": tuple(prefix)}
    if args.smollm2_wheel is not None and not (args.smollm2_wheel.exists()
                                               or list(args.smollm2_wheel.parent.glob(args.smollm2_wheel.name + ".*"))):
        parser.error(f"--smollm2-wheel {args.smollm2_wheel}: no such file, nor pieces {args.smollm2_wheel}.*")


def wave(args, parser, argv) -> int:
    if args.smoke:
        apply_smoke(args)
    else:
        args.model = "smollm2"
    chosen = wave_of(args, parser)
    apply_wave_defaults(args, chosen)
    check(args, parser)
    args.wave_name = ("smoke" if args.smoke else f"wave{args.number}") + ("-gate" if args.gate else "")
    jobs = waves.wave_jobs(chosen, args.seeds, args.best, bool(args.variant_flags["prefix"]),
                           args.best_correction, args.gate)
    args.all_jobs, args.slots = jobs, args.per_gpu
    print(f"[wave] {args.wave_name} ({chosen.what}) on {chosen.task}: {len(jobs)} runs, "
          f"{args.per_gpu} a GPU", flush=True)
    if args.plan:
        for job in jobs:
            print(f"  {job.task}/{job.run.name} ({job.gpus} GPU{'s' if job.gpus > 1 else ''})")
        return 0
    if supervisor.supervisor_alive(args.out):
        parser.error(f"a supervisor is already running for {args.out}: poll it "
                     f"(python -m benchmarks.grid.correction_grid poll {args.out})")
    if args.detach:
        return supervisor.detach(sys.argv[1:] if argv is None else list(argv), args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "supervisor.pid").write_text(str(os.getpid()))
    return supervisor.supervise(args, jobs)


def poll(args) -> int:
    return supervisor.poll(args.out, args.wait, args.every, args.bundle)
