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

An engine lost during a push is handed to failover (``HTTPRollout.engines.failed`` -> the restart
hook, which re-syncs the replacement) and left out of the rest of the push; the push goes on and
``sync_engines_lost`` counts it. For ``distributed`` (a group cannot lose a member): a request
that fails and whose server does not answer ``/health`` marks that engine lost; the trainer aborts
the group on its side and on every survivor (``/destroy_weights_update_group``, which on
sglang-kvc ends an NCCL wait from the HTTP thread; a gloo wait there is off the engine thread and
ends at ``--weight-sync-timeout``), builds a group of the survivors and sends the bucket again.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import requests
import torch
import torch.distributed as dist

from .hf_export import buckets, iter_hf_tensors
from .lifecycle import healthy

log = logging.getLogger(__name__)

MODES = ("inprocess", "tensor", "ipc", "disk", "distributed")
# seconds a weight-update group's broadcast may wait for a member (sglang_kvc.weights.transport
# GROUP_TIMEOUT_S, the servers' default: sent to them only when it differs, so a stock SGLang
# server gets no field it does not know)
GROUP_TIMEOUT_S = 120.0
NamedTensors = Callable[[], Iterator[tuple[str, torch.Tensor]]]


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _nbytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


class WeightSync:
    def __init__(self, mode: str, *, engine=None, http=None, bucket_bytes: int = 512 << 20,
                 disk_dir: str | Path | None = None, hf_config_dir: str | Path | None = None,
                 master_port: int | None = None, master_address: str = "127.0.0.1",
                 group_timeout_s: float = GROUP_TIMEOUT_S):
        if mode not in MODES:
            raise ValueError(f"--weight-sync must be one of {MODES}, got {mode!r}")
        if mode == "inprocess" and engine is None and _is_rank0():
            raise ValueError("--weight-sync inprocess needs the in-process engine")
        if mode != "inprocess" and http is None and _is_rank0():
            raise ValueError(f"--weight-sync {mode} needs --rollout-server-urls")
        if not group_timeout_s > 0:
            raise ValueError(f"--weight-sync-timeout must be positive, got {group_timeout_s}")
        self.mode, self.engine, self.http, self.bucket_bytes = mode, engine, http, bucket_bytes
        self.disk_dir, self.hf_config_dir = disk_dir, hf_config_dir
        self.group = _Group(http, master_address, master_port, group_timeout_s)
        # who talks to an engine: every colocated engine's host, or rank 0 for servers
        self.pushes = engine is not None if mode == "inprocess" else _is_rank0()
        self.version: str | None = None  # the last version pushed: what a restarted engine needs
        self._source: NamedTensors | None = None
        self._last_dir: Path | None = None
        self._lost: set[str] = set()  # URLs of engines that died during the current push

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
        self.group.invalidate(url)  # a new process at a member's URL: rebuilt on the next push
        if self.mode == "disk":
            self.http.call("/update_weights_from_disk",
                           {"model_path": str(self._last_dir), "weight_version": self.version},
                           urls=[url])
            return
        if _tensor_parallel_size() > 1:
            raise RuntimeError("re-syncing a restarted engine re-exports the weights, which needs "
                               "every tensor-parallel rank; use --weight-sync disk with TP > 1")
        mode = "tensor" if self.mode == "distributed" else self.mode
        # to this URL even while a push leaves its dead predecessor out (_lost holds that URL)
        self._push_buckets(mode, self._source(), self.version, [url], skip_lost=False)

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
        re-syncs its replacement (``_wait_for_lost``). ``distributed`` has ``_lose``."""
        slots = self.http.engines.urls
        self._lost.update(slots[s] for s in self.http.call_surviving(path, payload, urls))

    def _live(self, urls: list[str]) -> list[str]:
        return [u for u in urls if u not in self._lost]

    def _lose(self, broken: "GroupBroken") -> None:
        """The members of a broken push that are dead go to failover; none dead: a real error."""
        dead = [u for u in broken.failed if not healthy(u, self.http.health_timeout)]
        if not dead:
            raise RuntimeError(f"distributed weight update failed: {broken}") from broken
        for url in dead:
            log.warning("weight push: rollout engine %s is lost (%s); the push goes on without "
                        "it", url, broken.failed[url])
            self._lost.add(url)
            if url in self.http.engines.urls:  # else already replaced
                self.http.engines.failed(self.http.engines.urls.index(url), url,
                                         f"weight push: {broken.failed[url]}")

    # --- transports (rank 0) -----------------------------------------------------------------
    def _push_buckets(self, mode: str, tensors, version: str, urls: list[str],
                      skip_lost: bool = True) -> int:
        nbytes = 0
        for bucket in buckets(tensors, self.bucket_bytes):
            nbytes += _nbytes(bucket)
            if self.pushes:
                getattr(self, f"_push_{mode}")(bucket, version,
                                               self._live(urls) if skip_lost else urls)
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
        backend = "nccl" if flat.is_cuda else "gloo"
        names, dtypes, shapes = bucket_specs(bucket)
        meta = {"names": names, "dtypes": dtypes, "shapes": shapes, "weight_version": version,
                "flush_cache": True, "load_format": "flattened_bucket"}
        # each try either delivers the bucket to every member or loses one engine for good
        live = urls
        while live:
            try:
                name = self.group.ensure(live, backend)
                self.group.send(flat, "/update_weights_from_distributed",
                                dict(meta, group_name=name), live)
                return
            except GroupBroken as broken:
                self.group.abort(live)  # first: members still waiting in the broadcast leave it
                self._lose(broken)
                live = self._live(live)

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
                          {"model_path": str(out), "weight_version": version}, self._live(urls))
        return nbytes


class GroupBroken(RuntimeError):
    """Requests of some members of the weight-update group failed: ``failed`` maps their URLs
    to the error (the others may be waiting in the broadcast)."""

    def __init__(self, failed: dict[str, str]):
        super().__init__("; ".join(f"{u}: {e}" for u, e in failed.items()))
        self.failed = failed


class _Group:
    """The trainer's side of the weight-update process group (rank 0; servers 1..N)."""

    def __init__(self, http, address: str, port: int | None, timeout_s: float = GROUP_TIMEOUT_S):
        self.http, self.address, self.port, self.timeout_s = http, address, port, timeout_s
        self.pg = None
        self.urls: list[str] = []
        self.generation = 0
        self.stale = False  # a member was restarted (same URL, new process): rebuild
        # servers outlive trainers (and keep a dead trainer's groups): names of our own
        self.token = uuid.uuid4().hex[:8]

    @property
    def name(self) -> str:
        return f"weight_update_group_{self.token}_{self.generation}"

    def invalidate(self, url: str | None = None) -> None:
        # from the restart hook's thread: only a member's restart changes the group
        if url is None or url in self.urls:
            self.stale = True

    def ensure(self, urls: list[str], backend: str) -> str:
        """The group of exactly ``urls`` (built when needed); its name. ``GroupBroken`` when a
        server refuses to join (the rendezvous of the others is left to time out)."""
        if self.pg is not None and self.urls == urls and not self.stale:
            return self.name
        self._drop(urls)
        self.generation, self.stale = self.generation + 1, False
        from sglang_kvc import create_weight_update_group, weight_update_master_store

        world = 1 + len(urls)
        # listening before the servers are told its port (a free port looked up first may be
        # taken by any socket meanwhile: then every server waits out the timeout)
        store = weight_update_master_store(self.address, world, self.port or 0, self.timeout_s)
        port = store.port
        body = {"master_address": self.address, "master_port": port, "world_size": world,
                "group_name": self.name, "backend": backend}
        if self.timeout_s != GROUP_TIMEOUT_S:  # sglang-kvc's own field: stock SGLang never sees it
            body["timeout_s"] = self.timeout_s
        # the rendezvous blocks until all join: a server that refuses must end the wait
        made = _in_thread(create_weight_update_group, self.address, port, 0, world, backend,
                          self.name, self.timeout_s, store)
        _all_or_broken({_in_thread(self.http.post, f"{u}/init_weights_update_group",
                                   dict(body, rank_offset=1 + i), 0): u
                        for i, u in enumerate(urls)}, own=made)
        self.pg = made.result()
        self.urls = list(urls)
        return self.name

    def _drop(self, urls: list[str]) -> None:
        """Leave the old group; survivors drop their side too (best effort: some may be dead)."""
        if self.pg is not None:
            self.abort([u for u in self.urls if u in urls])

    def abort(self, urls: list[str]) -> None:
        """End the group on the trainer's side and on ``urls``' servers, from threads that are
        not waiting in it: NCCL waits end at once (communicators aborted), on both sides."""
        if self.pg is None:
            return
        with concurrent.futures.ThreadPoolExecutor(max(1, len(urls))) as pool:
            pool.map(_post_quietly, [u + "/destroy_weights_update_group" for u in urls],
                     [{"group_name": self.name}] * len(urls))
        self.pg.abort()
        self.pg, self.urls = None, []

    def send(self, flat: torch.Tensor, path: str, meta: dict, urls: list[str]) -> None:
        """Post ``meta`` to every server and broadcast ``flat``. ``GroupBroken`` as soon as a
        server's request fails: the broadcast is left behind, ended by ``abort``."""
        posts = {_in_thread(self.http.post, u + path, meta, 0): u for u in urls}
        sent = _in_thread(self.pg.broadcast, flat, 0)
        _all_or_broken(posts, own=sent)
        sent.result()


def _all_or_broken(futures: dict, own: concurrent.futures.Future, grace: float = 1.0) -> None:
    """Wait for the servers' requests (``futures``: URL each) and the trainer's side (``own``).
    At the first failure, give the others ``grace`` seconds to fail too (a broken broadcast
    fails the members next to the dead one, the trainer among them) and raise ``GroupBroken``
    for the servers that failed; the trainer's failure alone raises as itself."""
    for f in concurrent.futures.as_completed([*futures, own]):
        if f.exception() is None:
            continue
        concurrent.futures.wait(futures, timeout=grace)
        failed = {futures[g]: str(g.exception()) for g in futures
                  if g.done() and g.exception() is not None}
        if failed:
            raise GroupBroken(failed)
        raise RuntimeError(f"distributed weight update failed on the trainer's side: "
                           f"{own.exception()}") from own.exception()


def _post_quietly(url: str, body: dict, timeout: float = 10.0) -> None:
    """A best-effort request: the server may be dead, or busy (a stock SGLang server handles
    the destroy after the wait it would end)."""
    try:
        requests.post(url, json=body, timeout=timeout)
    except requests.RequestException:
        pass


def _in_thread(fn, *args) -> concurrent.futures.Future:
    """``fn(*args)`` in a daemon thread: what a broken group leaves waiting (until its timeout)
    must not hold up the trainer's exit, as an executor's threads, joined at exit, would."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - the caller's result() raises it
            done.set_exception(e)

    threading.Thread(target=run, daemon=True, name="weight-group").start()
    return done


def _tensor_parallel_size() -> int:
    ps = sys.modules.get("megatron.core.parallel_state")  # not loaded: no Megatron model here
    if ps is None or not ps.model_parallel_is_initialized():
        return 1
    return ps.get_tensor_model_parallel_world_size()

