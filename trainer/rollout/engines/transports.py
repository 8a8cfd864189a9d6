"""The ways a bucket of the trainer's weights reaches the engines (``--weight-sync``), one
``Transport`` each, in one registry (``TRANSPORTS``). ``WeightSync`` (``weight_sync.py``) walks
the buckets and keeps the version and the engines lost during a push; a transport speaks to the
engines only through their interface (``Engines.update_weights``; ``alive`` and ``lose`` over
HTTP), never by their URLs' slots.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import uuid
from pathlib import Path

import requests
import torch
import torch.distributed as dist

from .config import GROUP_TIMEOUT_S, WEIGHT_SYNC_MODES as MODES  # noqa: F401 - re-exported
from .hf_export import buckets


def is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _nbytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


def _timed(items, phases):
    """``items``, the time spent producing each counted as the ``export`` phase (the trainer's
    tensors to HF names: conversions and tensor-parallel gathers)."""
    it = iter(items)
    while True:
        with phases("export"):
            item = next(it, _END)
        if item is _END:
            return
        yield item


_END = object()


class Transport:
    """One bucket at a time (``send``), to every engine of the push still up."""

    failed: Exception | None = None  # what ended the last push's sends (fallback pending)

    def __init__(self, sync, master_address: str = "127.0.0.1", master_port: int | None = None,
                 timeout_s: float = GROUP_TIMEOUT_S):
        self.sync = sync

    def push(self, tensors, version: str, urls: list[str], skip_lost: bool = True) -> int:
        """Every bucket is exported on every rank (tensor-parallel gathers), even after a send
        failed that a fallback will redo: the ranks' collectives stay in step."""
        nbytes, self.failed = 0, None
        for bucket in _timed(buckets(tensors, self.sync.bucket_bytes), self.sync.phases):
            nbytes += _nbytes(bucket)
            if self.sync.pushes and self.failed is None:
                self._send(bucket, version, self.sync.live(urls) if skip_lost else urls)
        return nbytes

    def _send(self, bucket, version: str, urls: list[str]) -> None:
        try:
            self.send(bucket, version, urls)
        except RuntimeError as e:
            if not self.sync.may_fall_back:
                raise
            self.failed = e

    def send(self, bucket, version: str, urls: list[str]) -> None:
        raise NotImplementedError

    def resync(self, url: str, source, version: str) -> None:
        """The last push again, to one (re)started server only."""
        if _tensor_parallel_size() > 1:
            raise RuntimeError("re-syncing a restarted engine re-exports the weights, which needs "
                               "every tensor-parallel rank; use --weight-sync disk with TP > 1")
        # to this URL even while a push leaves its dead predecessor out (the lost set has it)
        self.push(source(), version, [url], skip_lost=False)


class InProcess(Transport):
    def send(self, bucket, version, urls):
        self.sync.update("/update_weights_from_tensor",
                         {"named_tensors": bucket, "weight_version": version}, urls)


class Tensor(Transport):
    def send(self, bucket, version, urls):
        from sglang_kvc import serialize_named_tensors

        with self.sync.phases("serialize"):
            payload = {"serialized_named_tensors": [serialize_named_tensors(bucket)],
                       "weight_version": version, "flush_cache": True}
        with self.sync.phases("transfer"):
            self.sync.update("/update_weights_from_tensor", payload, urls)


class Ipc(Transport):
    def push(self, tensors, version, urls, skip_lost=True) -> int:
        nbytes = super().push(tensors, version, urls, skip_lost)
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # free the buffers the engines have let go of
        return nbytes

    def send(self, bucket, version, urls):
        from sglang_kvc import serialize_ipc_bucket

        with self.sync.phases("flatten"):
            payload, keep_alive = serialize_ipc_bucket(bucket)
        with self.sync.phases("transfer"):
            self.sync.update("/update_weights_from_tensor",
                             {"serialized_named_tensors": [payload], "load_format": "ipc",
                              "weight_version": version, "flush_cache": True}, urls)
        del keep_alive  # every engine answered: none maps the buffer any more


class Disk(Transport):
    """HF safetensors in a directory, then ``/update_weights_from_disk``: written as the tensors
    come (no buckets)."""

    def __init__(self, sync, *args):
        super().__init__(sync)
        self.last_dir: Path | None = None

    def push(self, tensors, version, urls, skip_lost=True) -> int:
        from checkpoint_tools.hf_io import ShardedSafetensorsWriter, copy_tokenizer_files

        out = Path(self.sync.disk_dir) / f"weights-{version}"
        writer = ShardedSafetensorsWriter(out) if is_rank0() else None
        nbytes = 0
        with self.sync.phases("export_and_write"):
            for name, tensor in tensors:
                nbytes += tensor.numel() * tensor.element_size()
                if writer is not None:
                    writer.add(name, tensor.detach().cpu())
            if writer is not None:
                writer.close()
        if writer is not None:
            config = json.loads((Path(self.sync.hf_config_dir) / "config.json").read_text())
            (out / "config.json").write_text(json.dumps(config, indent=2))
            copy_tokenizer_files(self.sync.hf_config_dir, out)
            self.last_dir = out  # before the call: a replacement is re-synced from it
            with self.sync.phases("load"):
                self.sync.update("/update_weights_from_disk",
                                 {"model_path": str(out), "weight_version": version},
                                 self.sync.live(urls))
        return nbytes

    def resync(self, url, source, version):
        self.sync.target.call("/update_weights_from_disk",
                            {"model_path": str(self.last_dir), "weight_version": version},
                            urls=[url])


class Distributed(Transport):
    """A process group of the trainer (rank 0) and the servers; one broadcast per bucket."""

    def __init__(self, sync, master_address="127.0.0.1", master_port=None,
                 timeout_s=GROUP_TIMEOUT_S):
        super().__init__(sync)
        self.group = _Group(sync.target, master_address, master_port, timeout_s)

    def send(self, bucket, version, urls):
        from sglang_kvc import bucket_specs, flatten_bucket

        with self.sync.phases("flatten"):
            flat = flatten_bucket(bucket)
        backend = "nccl" if flat.is_cuda else "gloo"
        names, dtypes, shapes = bucket_specs(bucket)
        meta = {"names": names, "dtypes": dtypes, "shapes": shapes, "weight_version": version,
                "flush_cache": True, "load_format": "flattened_bucket"}
        # each try either delivers the bucket to every member or loses one engine for good
        live = urls
        while live:
            try:
                with self.sync.phases("group"):
                    name = self.group.ensure(live, backend)
                with self.sync.phases("transfer"):
                    self.group.send(flat, "/update_weights_from_distributed",
                                    dict(meta, group_name=name), live)
                return
            except GroupBroken as broken:
                self.group.abort(live)  # first: members still waiting in the broadcast leave it
                self.sync.lose(broken)
                live = self.sync.live(live)

    def close(self, urls: list[str]) -> None:
        """Leave the group (a fallback replaces this transport): the servers drop it too."""
        self.group.abort(urls)

    def resync(self, url, source, version):
        """Through the tensor transport (a process group has a fixed membership); the group is
        rebuilt before the next push."""
        self.group.invalidate(url)  # a new process at a member's URL
        Tensor(self.sync).resync(url, source, version)


# by --weight-sync's names (config.py), in their order; strict: a name without a class fails here
TRANSPORTS: dict[str, type[Transport]] = dict(zip(MODES, (InProcess, Tensor, Ipc, Disk, Distributed),
                                                  strict=True))


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
