"""One trainer rank as a Ray actor: the environment torchrun would give it, then the trainer's own
entry (``trainer.train.main``) in the actor's process, so the same bounded rendezvous, startup
phases and error handling apply; it hands the trainer the engine supervisor's restart hook. Its
GPU's index comes from Ray; every GPU of the node stays visible
(``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``) so NCCL sees its peers, as under torchrun.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import traceback

from .node import free_port, local_gpu_index, node_ip
from .supervisor import restart_hook_from_env

ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


@dataclasses.dataclass
class RankResult:
    rank: int
    code: int  # the trainer's exit code (0: done)
    error: str = ""  # one line: what went wrong
    detail: str = ""  # its traceback, when there was one

    @property
    def ok(self) -> bool:
        return self.code == 0


class _ErrorTail:
    """stderr as it was, remembering the last lines (the trainer prints its errors there)."""

    def __init__(self, stream, keep: int = 40):
        self.stream, self.lines, self._part = stream, collections.deque(maxlen=keep), ""

    def write(self, text: str) -> int:
        self._part += text.replace("\r", "\n")
        *done, self._part = self._part.split("\n")
        self.lines.extend(line for line in done if line.strip())
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)

    def last_error(self) -> str:
        errors = [line for line in self.lines if "error" in line.lower()]
        return (errors or list(self.lines) or ["(nothing on stderr)"])[-1].strip()


class TrainerRank:
    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def __repr__(self) -> str:  # Ray prefixes the rank's output with this: (TrainerRank1 pid=...)
        return f"TrainerRank{self.rank}"

    def master_address(self) -> tuple[str, int]:
        """Rank 0's node address and a free port there, for the rendezvous store."""
        host = node_ip()
        return host, free_port(host)

    def run(self, argv: list[str], master: tuple[str, int], cwd: str | None) -> RankResult:
        import ray

        gpu = local_gpu_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size),
                          LOCAL_RANK=str(gpu), MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        if cwd and os.path.isdir(cwd):  # relative paths in the flags mean the submitter's folder
            os.chdir(cwd)
        return self._main(argv)

    def _main(self, argv: list[str]) -> RankResult:
        from trainer.train import main

        tail = _ErrorTail(sys.stderr)
        try:
            with contextlib.redirect_stderr(tail):
                # the job's supervisor replaces a dead engine (job.py names it in this rank's
                # env); handed in here so that trainer.train knows nothing of Ray
                code = main(argv, restart_hook=restart_hook_from_env)
        except SystemExit as e:  # argparse errors
            code = e.code if isinstance(e.code, int) else 1
        except Exception as e:  # noqa: BLE001 - reported to the driver, which ends the job
            return RankResult(self.rank, 1, f"{type(e).__name__}: {e}", traceback.format_exc())
        return RankResult(self.rank, code or 0, tail.last_error() if code else "")
