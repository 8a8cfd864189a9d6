"""Weight transport formats shared by the server and its clients (the trainer).

- `/update_weights_from_tensor`: `serialized_named_tensors` is a list with one string per TP rank
  (this server has one rank, so one string). Each string is base64 of `torch.save(list of
  (hf_name, cpu_tensor))`; it is read back with `torch.load(weights_only=True)`, so it can carry
  tensors and names but no code. (SGLang ships CUDA IPC handles instead, which only work on the
  same machine; this format works over the network.) Use `serialize_named_tensors`.
- `/update_weights_from_distributed`: a standalone torch.distributed process group (NCCL on GPU,
  gloo on CPU) that does not touch the default group of either side. The trainer is rank 0 and
  creates the group with `create_weight_update_group(..., rank=0)`; the server joins as
  `rank_offset` (+ its own rank, 0). For each weight the server allocates a tensor of the given
  name/dtype/shape and receives it via a broadcast from rank 0, in the order of `names`.
"""

from __future__ import annotations

import base64
import datetime
import io

import torch
import torch.distributed as dist


def serialize_named_tensors(named_tensors) -> str:
    buf = io.BytesIO()
    torch.save([(str(n), t.detach().cpu().contiguous()) for n, t in named_tensors], buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def deserialize_named_tensors(payload: str) -> list[tuple[str, torch.Tensor]]:
    try:
        raw = base64.b64decode(payload, validate=True)
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any decoding failure is the client's input
        raise ValueError(f"cannot decode serialized_named_tensors: {e}") from e
    if not isinstance(data, (list, tuple)) or not all(
            isinstance(x, (list, tuple)) and len(x) == 2 and isinstance(x[0], str)
            and isinstance(x[1], torch.Tensor) for x in data):
        raise ValueError("serialized_named_tensors must hold a list of (name, tensor) pairs")
    return [(n, t) for n, t in data]


class WeightUpdateGroup:
    """A process group of its own: TCPStore rendezvous at master_address:master_port."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 backend: str = "gloo", group_name: str = "weight_update_group",
                 timeout_s: float = 600.0):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend, self.group_name = rank, world_size, backend, group_name
        self._tcp_store = dist.TCPStore(master_address, int(master_port), world_size,
                                        is_master=rank == 0, timeout=timeout)
        store = dist.PrefixStore(f"{group_name}/", self._tcp_store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()

    def destroy(self) -> None:
        self.pg = None
        self._tcp_store = None


def create_weight_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                               backend: str = "gloo", group_name: str = "weight_update_group"):
    """Trainer-side entry point (rank 0): the same group the server joins."""
    return WeightUpdateGroup(master_address, master_port, rank, world_size, backend, group_name)
