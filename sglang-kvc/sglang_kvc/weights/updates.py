"""The engine's weight updates (SGLang's API): from a checkpoint on disk, from tensors (in process,
serialized, or a CUDA IPC / shared-memory bucket), and from a trainer's broadcast over a weight
update group. Shapes are checked before anything is loaded; the load itself runs on the engine
thread between steps, so no step ever sees half-updated weights."""

from __future__ import annotations

from typing import Callable

import torch

from .loader import _destination as weight_destination
from .loader import iter_safetensors, safetensors_shapes, validate_shapes
from .transport import (GROUP_TIMEOUT_S, WeightUpdateGroup, bucket_layout,
                        deserialize_ipc_bucket, deserialize_named_tensors, receive_each,
                        receive_flattened)


class WeightUpdater:
    """`on_engine_thread(fn, *args)` runs fn between steps; `abort_all(message)` ends every
    request; `set_version(v)` is what responses report from then on."""

    def __init__(self, runner, on_engine_thread: Callable, abort_all: Callable[[str], int],
                 set_version: Callable[[str], None]):
        self.runner, self._call = runner, on_engine_thread
        self._abort_all, self._set_version = abort_all, set_version
        self.groups: dict[str, WeightUpdateGroup] = {}

    def from_disk(self, model_path: str, load_format: str | None = None,
                  weight_version: str | None = None, abort_all_requests: bool = False) -> dict:
        if load_format not in (None, "auto", "safetensors"):
            raise ValueError(f"load_format {load_format!r} not supported")
        validate_shapes(self.runner.model, safetensors_shapes(model_path))
        return self._call(self._apply, lambda: iter_safetensors(model_path),
                          weight_version, abort_all_requests)

    def from_tensor(self, named_tensors=None, serialized_named_tensors=None,
                    load_format: str | None = None, weight_version: str | None = None,
                    abort_all_requests: bool = False) -> dict:
        """`named_tensors`: list of (hf_name, tensor) in process; or the HTTP payload formats
        (transport.py) as `serialized_named_tensors`: base64 torch.save, or with
        `load_format="ipc"` a handle to a flattened bucket in another process on this host."""
        if load_format not in (None, "direct", "ipc"):
            raise ValueError(f"load_format {load_format!r} not supported (None, direct or ipc)")
        if named_tensors is None:
            named_tensors = _deserialize(serialized_named_tensors, load_format)
        named = list(named_tensors)
        try:
            validate_shapes(self.runner.model, [(n, tuple(t.shape)) for n, t in named])
            return self._call(self._apply, lambda: iter(named), weight_version, abort_all_requests)
        finally:
            # drop the views into an IPC buffer before answering: the sender frees it on the answer
            named.clear()

    def init_group(self, master_address: str, master_port: int, rank_offset: int,
                   world_size: int, group_name: str = "weight_update_group",
                   backend: str | None = None, timeout_s: float | None = None) -> dict:
        """`timeout_s` (sglang-kvc only): how long a broadcast may wait for a member."""
        if group_name in self.groups:
            raise ValueError(f"weight update group {group_name!r} already exists")
        backend = backend or ("nccl" if self.runner.device.type == "cuda" else "gloo")
        if backend == "nccl" and self.runner.device.type != "cuda":
            backend = "gloo"  # NCCL needs GPUs; a CPU engine joins over gloo
        # Rendezvous blocks until the trainer joins; done off the engine thread so steps go on.
        group = WeightUpdateGroup(master_address, master_port, rank_offset, world_size, backend,
                                  group_name, _timeout(timeout_s))
        self.groups[group_name] = group
        return {"success": True, "message": f"joined {group_name} as rank {rank_offset} ({backend})"}

    def from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                         group_name: str = "weight_update_group", weight_version: str | None = None,
                         abort_all_requests: bool = False, load_format: str | None = None) -> dict:
        """Receive `names` from the group's rank 0: one broadcast per tensor, or with
        `load_format="flattened_bucket"` one broadcast of all their bytes back to back."""
        group = self.groups.get(group_name)
        if group is None:
            raise ValueError(f"no weight update group named {group_name!r}")
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r} not supported (None or flattened_bucket)")
        entries = bucket_layout(names, dtypes, shapes)
        validate_shapes(self.runner.model, [(e.name, e.shape) for e in entries])
        receive = receive_flattened if load_format == "flattened_bucket" else receive_each
        if group.backend == "nccl":  # into the engine's device, on its thread (its stream)
            return self._call(self._apply, lambda: receive(group, entries, self.runner.device),
                              weight_version, abort_all_requests)
        # gloo receives into host memory on this (HTTP) thread: a broadcast that lost a member
        # waits here until the group's timeout (torch cannot abort it) while the engine thread
        # serves on and takes the trainer's re-sent bucket over a new group
        named = list(receive(group, entries, torch.device("cpu")))
        return self._call(self._apply, lambda: iter(named), weight_version, abort_all_requests)

    def rows_by_name(self, name: str, truncate_size: int = 100) -> list:
        """SGLang's /get_weights_by_name: the first `truncate_size` rows of an HF-named weight as
        the engine holds it (after any update), as nested lists."""
        if not isinstance(name, str):
            raise ValueError(f"name must be a string, got {name!r}")
        if not isinstance(truncate_size, int) or isinstance(truncate_size, bool) or truncate_size < 1:
            raise ValueError(f"truncate_size must be a positive integer, got {truncate_size!r}")
        return self._call(self._rows, name, truncate_size)

    def destroy_group(self, group_name: str = "weight_update_group") -> dict:
        group = self.groups.pop(group_name, None)
        if group is None:
            raise ValueError(f"no weight update group named {group_name!r}")
        group.destroy()  # aborts a broadcast still waiting in it (NCCL), from this thread
        return {"success": True, "message": f"destroyed {group_name}"}

    # ---------------------------------------------------------------- engine thread

    def _apply(self, make_named, weight_version, abort_all_requests) -> dict:
        if abort_all_requests:
            self._abort_all("Aborted for a weight update")
        n = self.runner.load_weights(make_named())
        if weight_version is not None:
            self._set_version(str(weight_version))
        return {"success": True, "message": f"Updated {n} tensors.", "num_paused_requests": 0}

    def _rows(self, name: str, rows: int) -> list:
        dst = weight_destination(self.runner.model, name)
        if dst is None:
            raise ValueError(f"{name} is not stored by this engine (tied to another weight, or a buffer)")
        return dst[:rows].tolist()


def _timeout(timeout_s) -> float:
    if timeout_s is None:
        return GROUP_TIMEOUT_S
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def _deserialize(payload, load_format: str | None) -> list:
    if not isinstance(payload, list) or not payload or not isinstance(payload[0], str):
        raise ValueError("serialized_named_tensors must be a non-empty list of strings")
    decode = deserialize_ipc_bucket if load_format == "ipc" else deserialize_named_tensors
    return decode(payload[0])
