"""Push the trainer's weights to the rollout engine after each rollout's updates.

Modes (``--weight-sync``):

- ``inprocess``: the colocated engine copies tensors directly.
- ``tensor``: ``/update_weights_from_tensor`` with the tensors serialized into the request
  (base64 ``torch.save``): works over the network, costs a copy to CPU and an encode.
- ``ipc``: ``/update_weights_from_tensor`` with ``load_format="ipc"``: the request carries a
  handle to one flattened bucket in this process's memory -- a CUDA IPC handle when the weights
  are on a GPU, a shared-memory file on CPU -- and the engine copies straight out of it. Same host
  only (a colocated engine in its own process); sglang-kvc servers only. Each bucket stays alive
  until every engine has answered.
- ``disk``: HF safetensors written to a directory, then ``/update_weights_from_disk``.
- ``distributed``: ``/update_weights_from_distributed``: a process group of its own, NCCL on GPU
  and gloo on CPU, the trainer broadcasting as rank 0; one broadcast per bucket (the bucket's
  tensors flattened into one byte buffer, ``load_format="flattened_bucket"``).

``--weight-sync auto`` with ``--rollout-server-urls`` on a GPU picks ``distributed`` (SGLang's
``init_weights_update_group`` / ``update_weights_from_distributed``: 4.87 s through HTTP tensors
at the SmolLM2 shape on 2 H200s before, docs/benchmarks.md issue 68) when the servers can reach
the trainer, with fallbacks (``ipc`` then ``disk`` on the same host, else ``tensor``) taken in
turn, by every rank together, if the first push fails; once a push has worked, failures are
errors as with an explicit mode. A server on the trainer's own GPU (one GPU holding both, where
NCCL cannot pair two ranks) gets ``ipc`` first instead (``sync_choice.py``, from the GPU the
server reports). ``phases`` holds the last push's seconds by phase; every push returns them as
``sync_<phase>_s`` and rank 0 prints the first push's to servers (its set-up included).

Each mode is one ``Transport`` of ``transports.TRANSPORTS`` (one bucket's way to the engines);
``WeightSync`` is what they share: buckets, the version, the engines lost during a push, re-sync.

Every rank calls ``push`` (tensor-parallel gathers): with colocated engines each engine's host
(the first rank of its data-parallel replica) hands its full copy to its own engine; with
servers, global rank 0 talks to all of them. Tensors travel in buckets of ``bucket_bytes`` and the
engine records the weight version, which the loop checks on the next rollout's ``meta_info``.

``resync(url)`` brings one (re)started server to the last pushed version (the restart hook of
``failover.py`` calls it through ``fleet.EngineFleet.resync``): disk mode re-sends the last
directory; tensor and ipc re-export the trainer's weights, which needs no tensor-parallel gather
(TP = 1; use disk otherwise); distributed re-sends through the tensor transport (a process group
has a fixed membership) and rebuilds its group before the next push.

An engine lost during a push is handed to failover (``HTTPRollout.lose`` -> the restart hook, which
re-syncs the replacement) and left out of the rest of the push; the push goes on and
``sync_engines_lost`` counts it. For ``distributed`` (a group cannot lose a member): a request
that fails and whose server does not answer ``/health`` marks that engine lost; the trainer aborts
the group on its side and on every survivor (``/destroy_weights_update_group``, which on
sglang-kvc ends an NCCL wait from the HTTP thread; a gloo wait there is off the engine thread and
ends at ``--weight-sync-timeout``), builds a group of the survivors and sends the bucket again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from .hf_export import iter_hf_tensors
from .transports import GROUP_TIMEOUT_S, MODES, TRANSPORTS, GroupBroken, is_rank0

__all__ = ["GROUP_TIMEOUT_S", "MODES", "WeightSync"]

log = logging.getLogger(__name__)

NamedTensors = Callable[[], Iterator[tuple[str, torch.Tensor]]]


class Phases:
    """Seconds of one push by phase, summed over its buckets (``with phases("flatten"):``):
    where a sync's time goes (export from the trainer, flatten, the group, the transfer)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


class WeightSync:
    def __init__(self, mode: str, *, engines=None, bucket_bytes: int = 512 << 20,
                 disk_dir: str | Path | None = None, hf_config_dir: str | Path | None = None,
                 master_port: int | None = None, master_address: str = "127.0.0.1",
                 group_timeout_s: float = GROUP_TIMEOUT_S, fallback: tuple[str, ...] = ()):
        """``engines``: the ``Engines`` this rank's pushes go to (its in-process engine for
        ``inprocess``, servers for the other modes); None where this rank talks to none.
        ``fallback``: modes tried in turn, every rank together, when the first push of ``mode``
        fails (``--weight-sync auto``); after one push has worked a failure is an error."""
        if mode not in MODES:
            raise ValueError(f"--weight-sync must be one of {MODES}, got {mode!r}")
        over_http = engines is not None and engines.over_http
        if mode == "inprocess" and (engines is None or over_http) and is_rank0():
            raise ValueError("--weight-sync inprocess needs the in-process engine")
        if mode != "inprocess" and not over_http and is_rank0():
            raise ValueError(f"--weight-sync {mode} needs --rollout-server-urls")
        if not group_timeout_s > 0:
            raise ValueError(f"--weight-sync-timeout must be positive, got {group_timeout_s}")
        self.mode, self.target, self.bucket_bytes = mode, engines, bucket_bytes
        self.disk_dir, self.hf_config_dir = disk_dir, hf_config_dir
        self._group_args = (master_address, master_port, group_timeout_s)
        self.transport = TRANSPORTS[mode](self, *self._group_args)
        self.fallback, self.proven = list(fallback), False
        self.phases = Phases()  # the last push's seconds by phase (benchmarks print them)
        # who talks to an engine: every colocated engine's host, or rank 0 for servers
        self.pushes = engines is not None if mode == "inprocess" else is_rank0()
        self.version: str | None = None  # the last version pushed: what a restarted engine needs
        self.source: NamedTensors | None = None
        self._lost: set[str] = set()  # URLs of engines that died during the current push

    @property
    def group(self):
        """``distributed``: the trainer's side of the weight-update group (else None)."""
        return getattr(self.transport, "group", None)

    def push(self, trainer, version: str) -> dict:
        return self.push_tensors(lambda: iter_hf_tensors(trainer.model.module, trainer.arch),
                                 version)

    def push_tensors(self, source: NamedTensors, version: str) -> dict:
        """Every engine up gets ``source()``'s tensors as ``version``."""
        start = time.perf_counter()
        if self.target is not None:
            self.target.wait_for_restarts()  # a replacement coming up gets this push too
        urls = self.target.urls if self.target is not None else []
        self._lost = set()
        # what resync() sends: set first, so the restart hook re-syncs an engine that dies during
        # this push to this push's weights (once), not to the previous ones
        self.source, self.version = source, version
        self.phases = Phases()
        nbytes = self.transport.push(source(), version, urls)
        while self._first_push_failed():
            nbytes = self.transport.push(source(), version, urls)
        first, self.proven = not self.proven, True
        lost = self._wait_for_lost()
        if dist.is_initialized():
            dist.barrier()
        seconds = time.perf_counter() - start
        # to servers, the set-up (group, IPC mappings) shows in the first push
        if first and self.mode != "inprocess" and is_rank0():
            print(f"[weight sync] first push by {self.mode}: {seconds:.3f} s ({self.phase_line()})",
                  flush=True)
        return {"sync_bytes": float(nbytes), "time_sync": seconds,
                "sync_engines_lost": float(lost),
                **{f"sync_{k}_s": v for k, v in self.phases.seconds.items()}}

    def phase_line(self) -> str:
        return ", ".join(f"{k} {v:.3f} s" for k, v in self.phases.seconds.items())

    def resync(self, url: str) -> None:
        """Give one (re)started server the last pushed weights and version (rank 0, servers)."""
        if self.version is None:
            return  # nothing pushed yet: it serves the checkpoint it started from, like the rest
        self.transport.resync(url, self.source, self.version)

    @property
    def may_fall_back(self) -> bool:
        """A send that fails now is kept for ``_first_push_failed`` instead of raising."""
        return not self.proven and bool(self.fallback)

    def _first_push_failed(self) -> bool:
        """Whether the push just made failed on rank 0 before any push worked, agreed by every
        rank (each re-exports the weights for the next mode: tensor-parallel gathers); then the
        next fallback mode is the transport."""
        if not self.may_fall_back:
            return False
        failed = self.transport.failed
        if dist.is_initialized():
            flag = torch.tensor([float(failed is not None)],
                                device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            failed = failed or (RuntimeError("another rank's push failed") if flag.item() else None)
        if failed is None:
            return False
        old, self.mode = self.mode, self.fallback.pop(0)
        close = getattr(self.transport, "close", None)
        if close is not None:
            close(self.live(self.target.urls if self.target is not None else []))
        msg = (f"weight sync: --weight-sync auto's first choice, {old}, failed ({failed}); "
               f"the weights go by {self.mode} from now on")
        log.warning(msg)
        if is_rank0():
            print(msg, flush=True)
        self.transport = TRANSPORTS[self.mode](self, *self._group_args)
        return True

    def _wait_for_lost(self) -> int:
        """Engines that died during this push: wait until their replacements are up (the restart
        hook re-synced each to this push), so the next rollout uses them; how many there were."""
        lost, self._lost = len(self._lost), set()
        if lost:
            self.target.wait_for_restarts()
        return lost

    # --- what the transports share ------------------------------------------------------------
    def update(self, path: str, payload: dict, urls: list[str]) -> None:
        """A weight update to the push's engines (``Engines.update_weights``). One that dies
        (fails and does not answer /health) is handed to failover and left out of the rest of
        this push; the restart hook re-syncs its replacement (``_wait_for_lost``).
        ``distributed`` has ``lose``."""
        self._lost.update(self.target.update_weights(path, payload, urls))

    def live(self, urls: list[str]) -> list[str]:
        return [u for u in urls if u not in self._lost]

    def lose(self, broken: GroupBroken) -> None:
        """The members of a broken push that are dead go to failover; none dead: a real error."""
        dead = [u for u in broken.failed if not self.target.alive(u)]
        if not dead:
            raise RuntimeError(f"distributed weight update failed: {broken}") from broken
        for url in dead:
            log.warning("weight push: rollout engine %s is lost (%s); the push goes on without "
                        "it", url, broken.failed[url])
            self._lost.add(url)
            self.target.lose(url, f"weight push: {broken.failed[url]}")

