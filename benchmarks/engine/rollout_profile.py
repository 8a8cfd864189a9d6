"""Kernel tables of one long rollout for studies/rollout_split.py: torch.profiler over 16 decode
steps at a given context (engine/throughput.py's profile_steps) and over one compression event
before that window (CompressionProfile). Top 25 kernels by device time (CPU time on a CPU)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch

from benchmarks.engine.throughput import profile_steps, write_profile


@dataclasses.dataclass
class CompressionProfile:
    """A torch.profiler window over one compression event: from the first compaction of an
    after-step call in [arm_from, arm_until) decode steps to that call's end (the trigger's
    scan before it is left out); kept apart from the decode window, which starts later."""

    engine: object
    arm_from: int
    arm_until: int
    prof: object = None
    on: bool = False
    done: bool = False

    @contextlib.contextmanager
    def active(self):
        comp, cuda = self.engine.runner.compressor, self.engine.runner.device.type == "cuda"
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
        compress, after = comp.compress, comp.after_step
        comp.compress = lambda seqs: (self._start(), compress(seqs))[1]
        comp.after_step = lambda seqs, is_prefill: (after(seqs, is_prefill), self._stop())[0]
        try:
            yield self
        finally:
            del comp.compress, comp.after_step  # the class's methods again

    def _armed(self) -> bool:
        steps = self.engine.loop.step_stats.decode_steps
        return not (self.done or self.on) and self.arm_from <= steps < self.arm_until

    def _start(self) -> None:
        if self._armed():
            _sync(self.engine)
            self.prof.start()
            self.on = True

    def _stop(self) -> None:
        if self.on:
            _sync(self.engine)
            self.prof.stop()
            self.on, self.done = False, True


def _sync(engine) -> None:
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()


def profile_rollout(engine, prompts: list[list[int]], reqs: list, args, name: str) -> dict:
    """Kernel tables over 16 decode steps at ~--profile-context tokens (all samples run to it)
    and, when the engine compresses, over one compression event before that window."""
    skip = max(1, args.profile_context - args.prompt_len)
    params = {k: v for k, v in reqs[0].sampling_params.items() if k != "sampling_seed"}
    ns = argparse.Namespace(profile=args.profile, logprobs=True)
    ids = [prompts[i // args.samples] for i in range(len(reqs))]
    engine.loop.step_stats = type(engine.step_stats)()  # decode steps counted from 0
    comp = engine.runner.compressor
    window = CompressionProfile(engine, max(0, skip - 3 * args.divide_length), skip - 2) if comp else None
    with window.active() if window else contextlib.nullcontext():
        out = {"decode": profile_steps(engine, ids, params, ns, skip=skip, steps=16,
                                       name=f"{name}_decode", row_limit=25)}
    if window is not None and window.done:
        cuda = engine.runner.device.type == "cuda"
        write_profile(window.prof, args.profile, f"{name}_compression", cuda, 25)
        out["compression"] = {"profiled": True}
    elif window is not None:
        out["compression"] = {"profiled": False}  # (no event in the armed steps)
    return out
