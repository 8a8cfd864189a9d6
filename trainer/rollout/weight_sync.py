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

Every rank calls ``push`` (tensor-parallel gathers): with colocated engines each engine's host
(the first rank of its data-parallel replica) hands its full copy to its own engine; with
servers, global rank 0 talks to all of them. Tensors travel in buckets of ``bucket_bytes`` and the
engine records the weight version, which the loop checks on the next rollout's ``meta_info``.

``resync(url)`` brings one (re)started server to the last pushed version (the restart hook of
``failover.py`` calls it through ``fleet.EngineFleet.resync``): disk mode re-sends the last
directory; tensor and ipc re-export the trainer's weights, which needs no tensor-parallel gather
(TP = 1; use disk otherwise); distributed re-sends through the tensor transport (a process group
has a fixed membership) and rebuilds its group before the next push.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from .hf_export import buckets, iter_hf_tensors

MODES = ("inprocess", "tensor", "ipc", "disk", "distributed")
NamedTensors = Callable[[], Iterator[tuple[str, torch.Tensor]]]


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _nbytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


class WeightSync:
    def __init__(self, mode: str, *, engine=None, http=None, bucket_bytes: int = 512 << 20,
                 disk_dir: str | Path | None = None, hf_config_dir: str | Path | None = None,
                 master_port: int | None = None, master_address: str = "127.0.0.1"):
        if mode not in MODES:
            raise ValueError(f"--weight-sync must be one of {MODES}, got {mode!r}")
        if mode == "inprocess" and engine is None and _is_rank0():
            raise ValueError("--weight-sync inprocess needs the in-process engine")
        if mode != "inprocess" and http is None and _is_rank0():
            raise ValueError(f"--weight-sync {mode} needs --rollout-server-urls")
        self.mode, self.engine, self.http, self.bucket_bytes = mode, engine, http, bucket_bytes
        self.disk_dir, self.hf_config_dir = disk_dir, hf_config_dir
        self.group = _Group(http, master_address, master_port)
        # who talks to an engine: every colocated engine's host, or rank 0 for servers
        self.pushes = engine is not None if mode == "inprocess" else _is_rank0()
        self.version: str | None = None  # the last version pushed: what a restarted engine needs
        self._source: NamedTensors | None = None
        self._last_dir: Path | None = None
        self._lost: set[int] = set()  # slots of engines that died during the current push

    def push(self, trainer, version: str) -> dict:
        return self.push_tensors(lambda: iter_hf_tensors(trainer.model.module, trainer.arch),
                                 version)

    def push_tensors(self, source: NamedTensors, version: str) -> dict:
        """Every engine up gets ``source()``'s tensors as ``version``."""
        start = time.perf_counter()
        if self.http is not None:
            self.http.wait_for_restarts()  # a replacement coming up gets this push too
        urls = self.http.urls if self.http is not None else []
        self._lost = set()
        # what resync() sends: set first, so the restart hook re-syncs an engine that dies during
        # this push to this push's weights (once), not to the previous ones
        self._source, self.version = source, version
        if self.mode == "disk":
            nbytes = self._push_disk(source(), version, urls)
        else:
            nbytes = self._push_buckets(self.mode, source(), version, urls)
        lost = self._wait_for_lost()
        if dist.is_initialized():
            dist.barrier()
        return {"sync_bytes": float(nbytes), "time_sync": time.perf_counter() - start,
                "sync_engines_lost": float(lost)}

    def resync(self, url: str) -> None:
        """Give one (re)started server the last pushed weights and version (rank 0, servers)."""
        if self.version is None:
            return  # nothing pushed yet: it serves the checkpoint it started from, like the rest
        self.group.invalidate()  # the process group lost a member; rebuilt on the next push
        if self.mode == "disk":
            self.http.call("/update_weights_from_disk",
                           {"model_path": str(self._last_dir), "weight_version": self.version},
                           urls=[url])
            return
        if _tensor_parallel_size() > 1:
            raise RuntimeError("re-syncing a restarted engine re-exports the weights, which needs "
                               "every tensor-parallel rank; use --weight-sync disk with TP > 1")
        mode = "tensor" if self.mode == "distributed" else self.mode
        self._push_buckets(mode, self._source(), self.version, [url])

    def _wait_for_lost(self) -> int:
        """Engines that died during this push: wait until their replacements are up (the restart
        hook re-synced each to this push), so the next rollout uses them; how many there were."""
        lost, self._lost = len(self._lost), set()
        if lost:
            self.http.wait_for_restarts()
        return lost

    def _control(self, path: str, payload: dict, urls: list[str]) -> None:
        """A control request to the push's engines. One that dies (fails and does not answer
        /health) is handed to failover and left out of the rest of this push; the restart hook
        re-syncs its replacement (``_wait_for_lost``). Not for ``distributed``: a process group cannot lose a member."""
        slots = self.http.engines.urls
        live = [u for u in urls if slots.index(u) not in self._lost] if self._lost else urls
        self._lost.update(self.http.call_surviving(path, payload, live))

    # --- transports (rank 0) -----------------------------------------------------------------
    def _push_buckets(self, mode: str, tensors, version: str, urls: list[str]) -> int:
        nbytes = 0
        for bucket in buckets(tensors, self.bucket_bytes):
            nbytes += _nbytes(bucket)
            if self.pushes:
                getattr(self, f"_push_{mode}")(bucket, version, urls)
        if mode == "ipc" and torch.cuda.is_available():
            torch.cuda.ipc_collect()  # free the buffers the engines have let go of
        return nbytes

    def _push_inprocess(self, bucket, version, urls):
        # same process, same device: the engine copies straight from the trainer's tensors
        self.engine.update_weights_from_tensor(named_tensors=bucket, weight_version=version)

    def _push_tensor(self, bucket, version, urls):
        from sglang_kvc import serialize_named_tensors

        payload = {"serialized_named_tensors": [serialize_named_tensors(bucket)],
                   "weight_version": version, "flush_cache": True}
        self._control("/update_weights_from_tensor", payload, urls)

    def _push_ipc(self, bucket, version, urls):
        from sglang_kvc import serialize_ipc_bucket

        payload, keep_alive = serialize_ipc_bucket(bucket)
        self._control("/update_weights_from_tensor",
                      {"serialized_named_tensors": [payload], "load_format": "ipc",
                       "weight_version": version, "flush_cache": True}, urls)
        del keep_alive  # every engine answered: none maps the buffer any more

    def _push_distributed(self, bucket, version, urls):
        from sglang_kvc import bucket_specs, flatten_bucket

        flat = flatten_bucket(bucket)
        group, name = self.group.ensure(urls, "nccl" if flat.is_cuda else "gloo")
        names, dtypes, shapes = bucket_specs(bucket)
        meta = {"names": names, "dtypes": dtypes, "shapes": shapes, "weight_version": version,
                "group_name": name, "flush_cache": True, "load_format": "flattened_bucket"}
        self.group.send(flat, "/update_weights_from_distributed", meta, urls)

    def _push_disk(self, tensors, version, urls) -> int:
        from checkpoint_tools.hf_io import ShardedSafetensorsWriter, copy_tokenizer_files

        out = Path(self.disk_dir) / f"weights-{version}"
        writer = ShardedSafetensorsWriter(out) if _is_rank0() else None
        nbytes = 0
        for name, tensor in tensors:
            nbytes += tensor.numel() * tensor.element_size()
            if writer is not None:
                writer.add(name, tensor.detach().cpu())
        if writer is not None:
            writer.close()
            config = json.loads((Path(self.hf_config_dir) / "config.json").read_text())
            (out / "config.json").write_text(json.dumps(config, indent=2))
            copy_tokenizer_files(self.hf_config_dir, out)
            self._last_dir = out  # before the call: a replacement is re-synced from it
            self._control("/update_weights_from_disk",
                          {"model_path": str(out), "weight_version": version}, urls)
        return nbytes


class _Group:
    """The trainer's side of the weight-update process group (rank 0; servers 1..N)."""

    def __init__(self, http, address: str, port: int | None):
        self.http, self.address, self.port = http, address, port
        self.pg = None
        self.urls: list[str] = []
        self.generation = 0

    @property
    def name(self) -> str:
        return f"weight_update_group_{self.generation}"

    def invalidate(self) -> None:
        self.urls = []  # no member list matches: the next ensure() rebuilds

    def ensure(self, urls: list[str], backend: str):
        if self.pg is not None and self.urls == urls:
            return self.pg, self.name
        self._drop(urls)
        self.generation += 1
        from sglang_kvc import create_weight_update_group

        port, world = self.port or _free_port(), 1 + len(urls)
        body = {"master_address": self.address, "master_port": port, "world_size": world,
                "group_name": self.name, "backend": backend}
        pool = concurrent.futures.ThreadPoolExecutor(world)
        try:  # the rendezvous blocks until all join: a server that refuses must end the wait
            made = pool.submit(create_weight_update_group, self.address, port, 0, world, backend,
                               self.name)
            _first_error([pool.submit(self.http.post, f"{u}/init_weights_update_group",
                                      dict(body, rank_offset=1 + i)) for i, u in enumerate(urls)])
            self.pg = made.result()
        finally:
            pool.shutdown(wait=False)
        self.urls = list(urls)
        return self.pg, self.name

    def _drop(self, urls: list[str]) -> None:
        """Leave the old group; survivors drop their side too (best effort: some may be dead)."""
        if self.pg is None:
            return
        for u in set(self.urls) & set(urls):
            try:
                self.http.post(f"{u}/destroy_weights_update_group", {"group_name": self.name}, 0)
            except Exception:  # noqa: BLE001 - a restarted server on the same URL has no group
                pass
        self.pg.destroy()
        self.pg = None

    def send(self, flat: torch.Tensor, path: str, meta: dict, urls: list[str]) -> None:
        """Post ``meta`` to every server and broadcast ``flat``; a server that refuses ends the
        wait (the broadcast thread is left behind and the group rebuilt) instead of hanging."""
        errors: list[Exception] = []
        sender = threading.Thread(target=_collect, args=(errors, self.pg.broadcast, flat, 0),
                                  daemon=True, name="weights-broadcast")
        pool = concurrent.futures.ThreadPoolExecutor(len(urls))
        try:
            posts = [pool.submit(self.http.post, u + path, meta, 0) for u in urls]
            sender.start()
            _first_error(posts)
        except Exception as e:
            self.pg, self.urls = None, []  # a broadcast some member never joins: start afresh
            raise RuntimeError(f"distributed weight update failed: {e}") from e
        finally:
            pool.shutdown(wait=False)
        sender.join()
        if errors:
            raise RuntimeError(f"distributed weight update failed: {errors[0]}")


def _first_error(futures) -> None:
    """Wait for all; raise the first failure as soon as it happens."""
    for f in concurrent.futures.as_completed(futures):
        f.result()


def _collect(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def _tensor_parallel_size() -> int:
    ps = sys.modules.get("megatron.core.parallel_state")  # not loaded: no Megatron model here
    if ps is None or not ps.model_parallel_is_initialized():
        return 1
    return ps.get_tensor_model_parallel_world_size()


def _free_port() -> int:
    from checkpoint_tools.cpu_megatron import free_port

    return free_port()
