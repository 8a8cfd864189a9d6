"""The trainer/engine GPU layouts that the studies and the grid launch (issue 65: shared by
``benchmarks/studies/layouts.py`` and ``benchmarks/grid/waves.py``, so neither imports the other)."""

from __future__ import annotations

import dataclasses
import sys


@dataclasses.dataclass(frozen=True)
class Layout:
    trainer_gpus: int
    flags: tuple[str, ...] = ()
    engine_gpus: int = 0  # GPUs of their own for engines (disaggregated)
    full_gpu: bool = False  # an engine's GPU is its own: a pool for its whole share of the batch

    @property
    def gpus(self) -> int:
        return self.trainer_gpus + self.engine_gpus

    @property
    def generating_gpus(self) -> int:
        """GPUs with an engine: the engines' own, else every trainer GPU (an engine per GPU)."""
        return self.engine_gpus or self.trainer_gpus


def _disagg(trainer: int, engines: int, *flags: str, full_gpu: bool = False) -> Layout:
    return Layout(trainer, ("--rollout-num-gpus", str(engines), *flags), engines, full_gpu)


_S1, _S2, _PARTIAL = ("--max-staleness", "1"), ("--max-staleness", "2"), ("--partial-rollout",)
_PROC = ("--max-staleness", "1", "--rollout-engine-process")
LAYOUTS = {
    "1gpu-sync": Layout(1),
    "1gpu-s1-proc": Layout(1, _PROC),
    "coloc-dp2-sync": Layout(2),
    "coloc-dp2-s1-proc": Layout(2, _PROC),
    "coloc-tp2-sync": Layout(2, ("--tensor-model-parallel-size", "2")),
    "coloc-dp4-sync": Layout(4),
    "coloc-dp4-s1-proc": Layout(4, _PROC),
    "coloc-tp2dp2-sync": Layout(4, ("--tensor-model-parallel-size", "2")),
    "disagg-sync": _disagg(1, 1),
    "disagg-s1": _disagg(1, 1, *_S1),
    "disagg-s2": _disagg(1, 1, *_S2),
    "disagg-s1-partial": _disagg(1, 1, *_S1, *_PARTIAL),
    "disagg-s2-partial": _disagg(1, 1, *_S2, *_PARTIAL),
    "disagg-s1-fullgpu": _disagg(1, 1, *_S1, full_gpu=True),
    "disagg-s2-fullgpu": _disagg(1, 1, *_S2, full_gpu=True),
    "disagg-s1-partial-fullgpu": _disagg(1, 1, *_S1, *_PARTIAL, full_gpu=True),
    "disagg-2x2-s1-fullgpu": _disagg(2, 2, *_S1, full_gpu=True),
    "disagg-3x1-s1-fullgpu": _disagg(3, 1, *_S1, full_gpu=True),
    "disagg-1x3-s1-fullgpu": _disagg(1, 3, *_S1, full_gpu=True),
}


def launcher(layout: Layout) -> tuple[str, ...]:
    """``torch.distributed.run`` as users launch the trainer: a process per trainer GPU, and a
    free port of its own (``--standalone``), so runs sharing a host do not collide."""
    return (sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(layout.trainer_gpus))
