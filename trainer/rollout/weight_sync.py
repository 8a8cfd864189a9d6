"""Push the trainer's weights to the rollout engine after each rollout's updates.

Modes (``--weight-sync``): ``inprocess`` (the colocated engine copies tensors directly),
``tensor`` (``/update_weights_from_tensor``), ``disk`` (HF safetensors written to a directory,
then ``/update_weights_from_disk``), ``distributed`` (``/update_weights_from_distributed``: a
process group of its own, NCCL on GPU and gloo on CPU, the trainer broadcasting as rank 0).
Every rank calls ``push`` (tensor-parallel gathers): with colocated engines each engine's host
(the first rank of its data-parallel replica) hands its full copy to its own engine; with
servers, global rank 0 talks to all of them.
Tensors travel in buckets of ``bucket_bytes`` and the engine records the weight version, which
the loop checks on the next rollout's ``meta_info``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch.distributed as dist

from .hf_export import buckets, iter_hf_tensors

MODES = ("inprocess", "tensor", "disk", "distributed")


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


class WeightSync:
    def __init__(self, mode: str, *, engine=None, http=None, bucket_bytes: int = 512 << 20,
                 disk_dir: str | Path | None = None, hf_config_dir: str | Path | None = None,
                 master_port: int | None = None):
        if mode not in MODES:
            raise ValueError(f"--weight-sync must be one of {MODES}, got {mode!r}")
        if mode == "inprocess" and engine is None and _is_rank0():
            raise ValueError("--weight-sync inprocess needs the in-process engine")
        if mode != "inprocess" and http is None and _is_rank0():
            raise ValueError(f"--weight-sync {mode} needs --rollout-server-urls")
        self.mode, self.engine, self.http, self.bucket_bytes = mode, engine, http, bucket_bytes
        self.disk_dir, self.hf_config_dir = disk_dir, hf_config_dir
        self.master_port = master_port
        self._group = None
        # who talks to an engine: every colocated engine's host, or rank 0 for servers
        self.pushes = engine is not None if mode == "inprocess" else _is_rank0()

    def push(self, trainer, version: str) -> dict:
        start = time.perf_counter()
        tensors = iter_hf_tensors(trainer.model.module, trainer.arch)
        nbytes = 0
        if self.mode == "disk":
            nbytes = self._push_disk(tensors, version)
        else:
            for bucket in buckets(tensors, self.bucket_bytes):
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                if self.pushes:
                    getattr(self, f"_push_{self.mode}")(bucket, version)
        if dist.is_initialized():
            dist.barrier()
        return {"sync_bytes": float(nbytes), "time_sync": time.perf_counter() - start}

    # --- transports (rank 0) -----------------------------------------------------------------
    def _push_inprocess(self, bucket, version):
        # same process, same device: the engine copies straight from the trainer's tensors
        self.engine.update_weights_from_tensor(named_tensors=bucket, weight_version=version)

    def _push_tensor(self, bucket, version):
        from sglang_kvc.weight_sync import serialize_named_tensors

        payload = {"serialized_named_tensors": [serialize_named_tensors(bucket)],
                   "weight_version": version, "flush_cache": True}
        self.http.call("/update_weights_from_tensor", payload)

    def _push_distributed(self, bucket, version):
        from sglang_kvc.weight_sync import create_weight_update_group

        backend = "nccl" if bucket[0][1].is_cuda else "gloo"
        if self._group is None:
            port = self.master_port or _free_port()
            world = 1 + len(self.http.urls)
            body = {"master_address": "127.0.0.1", "master_port": port, "world_size": world,
                    "group_name": "weight_update_group", "backend": backend}
            threads = [threading.Thread(target=self.http._post, args=(
                f"{url}/init_weights_update_group", dict(body, rank_offset=1 + i), 1))
                for i, url in enumerate(self.http.urls)]
            for t in threads:
                t.start()
            self._group = create_weight_update_group("127.0.0.1", port, 0, world, backend)
            for t in threads:
                t.join()
        meta = {"names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).replace("torch.", "") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], "weight_version": version,
                "group_name": "weight_update_group", "flush_cache": True}
        errors = []
        threads = [threading.Thread(target=lambda u=u: _collect(errors, self.http._post,
                                                                 f"{u}/update_weights_from_distributed",
                                                                 meta, 0))
                   for u in self.http.urls]
        for t in threads:
            t.start()
        for _, tensor in bucket:
            self._group.broadcast(tensor.contiguous(), src=0)
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"distributed weight update failed: {errors[0]}")

    def _push_disk(self, tensors, version) -> int:
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
            self.http.call("/update_weights_from_disk",
                           {"model_path": str(out), "weight_version": version})
        return nbytes


def _collect(errors, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - reported by the caller
        errors.append(e)


def _free_port() -> int:
    from checkpoint_tools.cpu_megatron import free_port

    return free_port()
