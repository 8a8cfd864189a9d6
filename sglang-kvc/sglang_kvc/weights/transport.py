"""Weight transport formats shared by the server and its clients (the trainer).

- `/update_weights_from_tensor`: `serialized_named_tensors` is a list with one string per TP rank
  (this server has one rank, so one string). Each string is base64 of `torch.save(list of
  (hf_name, cpu_tensor))`; it is read back with `torch.load(weights_only=True)`, so it can carry
  tensors and names but no code. This format works over the network. Use
  `serialize_named_tensors`.
- `/update_weights_from_tensor` with `load_format="ipc"`: same host only. The string is JSON (never
  a pickle): the `names`/`dtypes`/`shapes` of one flattened bucket (every tensor's bytes back to
  back, SGLang's "flattened_bucket" layout) and a `handle` to that byte buffer in the sender's
  memory: a CUDA IPC handle of the sender's GPU (named by UUID, so differing
  CUDA_VISIBLE_DEVICES do not matter), or on CPU the name of a torch shared-memory file. The
  server maps the buffer, copies each tensor into its weights and lets go of the mapping before it
  answers; the sender keeps the buffer alive until that answer. Use `serialize_ipc_bucket`.
- `/update_weights_from_distributed`: a standalone torch.distributed process group (NCCL on GPU,
  gloo on CPU) that does not touch the default group of either side. The trainer is rank 0 and
  creates the group with `create_weight_update_group(..., rank=0)`; the server joins as
  `rank_offset` (+ its own rank, 0). For each request the server allocates the named tensors and
  receives them via broadcasts from rank 0, in the order of `names`: one broadcast per tensor, or
  with `load_format="flattened_bucket"` one broadcast of a uint8 buffer holding all of them back to
  back (as SGLang's flattened buckets), which is what the trainer sends. A member that dies
  mid-broadcast leaves others waiting: `WeightUpdateGroup.abort` (the destroy route) ends an NCCL
  wait at once; a gloo wait (which torch cannot abort) ends at the group's timeout
  (`timeout_s`, default `GROUP_TIMEOUT_S`), and what it received is dropped.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import io
import json
import math
import re
from pathlib import Path
from typing import Iterator

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


# ================================================================ flattened buckets

@dataclasses.dataclass(frozen=True)
class FlatEntry:
    """One tensor's place in a flattened bucket: bytes [start, end) of the uint8 buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def parse_dtype(name) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(shape) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
        raise ValueError(f"a shape must be a list of non-negative integers, got {shape!r}")
    return tuple(shape)


def specs(named) -> tuple[list[str], list[str], list[list[int]]]:
    """The `names`, `dtypes`, `shapes` fields describing (name, tensor) pairs."""
    return ([str(n) for n, _ in named], [dtype_name(t.dtype) for _, t in named],
            [list(t.shape) for _, t in named])


def bucket_layout(names, dtypes, shapes) -> list[FlatEntry]:
    """Byte ranges of the tensors laid back to back in `names` order. The receiver recomputes
    them from names/dtypes/shapes, so no client-given offset is ever trusted."""
    if not all(isinstance(x, list) for x in (names, dtypes, shapes)):
        raise ValueError("names, dtypes and shapes must be lists")
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError("names, dtypes and shapes must have the same length")
    entries, offset = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not isinstance(name, str):
            raise ValueError(f"a tensor name must be a string, got {name!r}")
        dtype, shape = parse_dtype(dtype), _shape(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        entries.append(FlatEntry(name, dtype, shape, offset, offset + nbytes))
        offset += nbytes
    return entries


def _nbytes(entries: list[FlatEntry]) -> int:
    return entries[-1].end if entries else 0


def flatten_into(buf: torch.Tensor, named, entries: list[FlatEntry]) -> None:
    for (_, t), e in zip(named, entries):
        buf[e.start:e.end].copy_(t.detach().contiguous().view(-1).view(torch.uint8))


def flatten(named, device=None) -> torch.Tensor:
    """One uint8 buffer holding every tensor's bytes in order (SGLang's flattened bucket)."""
    entries = bucket_layout(*specs(named))
    buf = torch.empty(_nbytes(entries), dtype=torch.uint8, device=device or named[0][1].device)
    flatten_into(buf, named, entries)
    return buf


def unflatten(buf: torch.Tensor, entries: list[FlatEntry]) -> list[tuple[str, torch.Tensor]]:
    """Views into `buf` (copies where a tensor's offset is not aligned to its item size)."""
    if buf.numel() != _nbytes(entries):
        raise ValueError(f"the buffer holds {buf.numel()} bytes, the tensors need {_nbytes(entries)}")
    out = []
    for e in entries:
        piece = buf[e.start:e.end]
        if e.start % e.dtype.itemsize:
            piece = piece.clone()  # a dtype view needs an offset that is a multiple of the item size
        out.append((e.name, piece.view(e.dtype).view(e.shape)))
    return out


# ================================================================ IPC (same host)

_SHM_NAME = re.compile(r"/torch_\d+_\d+_\d+")
_IPC_HINT = ("the ipc transport needs the sender on this host (and, for CUDA, a GPU this server "
             "sees); use the tensor transport otherwise")


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def _unb64(text) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


def _uint(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def shared_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer another process on this host can map: a CUDA allocation (IPC handle), or
    on CPU a torch shared-memory file (moved there before it is filled, so nothing is copied)."""
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    if buf.device.type == "cpu":
        buf.untyped_storage()._share_filename_cpu_()
    return buf


def share_handle(buf: torch.Tensor) -> dict:
    if buf.is_cuda:
        return _share_cuda(buf)
    _, filename, nbytes = buf.untyped_storage()._share_filename_cpu_()
    return {"kind": "cpu_shm", "filename": filename.decode(), "nbytes": int(nbytes)}


def _share_cuda(buf: torch.Tensor) -> dict:
    from torch.multiprocessing.reductions import reduce_tensor

    # the copies into buf must be done before another process reads it
    torch.cuda.current_stream(buf.device).synchronize()
    try:
        _, args = reduce_tensor(buf)
    except RuntimeError as e:  # e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        raise RuntimeError(f"cannot share a CUDA buffer through IPC: {e}") from e
    (_, _, _, tensor_offset, _, _, device, handle, storage_bytes, storage_offset, _,
     ref_handle, ref_offset, event_handle, event_sync) = args
    return {"kind": "cuda", "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
            "numel": buf.numel(), "tensor_offset": int(tensor_offset),
            "storage_handle": _b64(handle), "storage_size_bytes": int(storage_bytes),
            "storage_offset_bytes": int(storage_offset), "ref_counter_handle": _b64(ref_handle),
            "ref_counter_offset": int(ref_offset), "event_handle": _b64(event_handle),
            "event_sync_required": bool(event_sync)}


def serialize_ipc_bucket(named) -> tuple[str, torch.Tensor]:
    """The `load_format="ipc"` payload for one bucket, and the buffer it points at: the caller
    keeps that buffer alive until the server has answered."""
    names, dtypes, shapes = specs(named)
    entries = bucket_layout(names, dtypes, shapes)
    buf = shared_buffer(_nbytes(entries), named[0][1].device)
    flatten_into(buf, named, entries)
    body = {"names": names, "dtypes": dtypes, "shapes": shapes, "handle": share_handle(buf)}
    return json.dumps(body), buf


def deserialize_ipc_bucket(payload) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into the sender's buffer; drop them before answering the sender."""
    try:
        body = json.loads(payload)
    except (TypeError, ValueError) as e:
        raise ValueError(f"load_format ipc: the payload is not JSON: {e}") from e
    if not isinstance(body, dict) or not isinstance(body.get("handle"), dict):
        raise ValueError("load_format ipc: the payload must be an object with names, dtypes, "
                         "shapes and handle")
    entries = bucket_layout(body.get("names"), body.get("dtypes"), body.get("shapes"))
    buf = open_ipc_buffer(body["handle"])
    if buf.numel() < _nbytes(entries):
        raise ValueError(f"the IPC buffer holds {buf.numel()} bytes, the tensors need "
                         f"{_nbytes(entries)}")
    return unflatten(buf[:_nbytes(entries)], entries)


def open_ipc_buffer(handle: dict) -> torch.Tensor:
    kind = handle.get("kind")
    if kind not in ("cpu_shm", "cuda"):
        raise ValueError(f"handle kind must be cpu_shm or cuda, got {kind!r}")
    try:
        return _open_shm(handle) if kind == "cpu_shm" else _open_cuda(handle)
    except ValueError:
        raise
    except (RuntimeError, OSError, KeyError, TypeError, binascii.Error) as e:
        raise ValueError(f"cannot open the {kind} IPC buffer ({type(e).__name__}: {e}); "
                         f"{_IPC_HINT}") from e


def _open_shm(h: dict) -> torch.Tensor:
    """Map the sender's file read-only, without torch's shared-memory manager: registering with
    the sender's manager would keep that process (and the sender's stdout) alive as long as this
    server lives. torch's file holds a small refcount header before the data."""
    filename = h["filename"]
    if not isinstance(filename, str) or not _SHM_NAME.fullmatch(filename):
        raise ValueError(f"not a torch shared-memory name: {filename!r}")
    nbytes = _uint(h["nbytes"], "nbytes")
    path = Path("/dev/shm") / filename.lstrip("/")
    size = path.stat().st_size
    header = size - nbytes
    if not 0 <= header <= 4096:
        raise ValueError(f"{filename} holds {size} bytes, not {nbytes} bytes of tensor data")
    whole = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    return whole[header:]


def _cuda_device(uuid) -> int:
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise ValueError(f"this server sees no GPU {uuid!r}; {_IPC_HINT}")


def _open_cuda(h: dict) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    device = _cuda_device(h["device_uuid"])
    numel, offset = _uint(h["numel"], "numel"), _uint(h["tensor_offset"], "tensor_offset")
    size = _uint(h["storage_size_bytes"], "storage_size_bytes")
    if offset + numel > size:
        raise ValueError(f"tensor bytes [{offset}, {offset + numel}) outside the {size}-byte storage")
    return rebuild_cuda_tensor(
        torch.Tensor, torch.Size([numel]), (1,), offset, torch.UntypedStorage, torch.uint8, device,
        _unb64(h["storage_handle"]), size, _uint(h["storage_offset_bytes"], "storage_offset_bytes"),
        False, _unb64(h["ref_counter_handle"]), _uint(h["ref_counter_offset"], "ref_counter_offset"),
        _unb64(h["event_handle"]), bool(h["event_sync_required"]))


# ================================================================ process group

GROUP_TIMEOUT_S = 120.0  # a collective waiting this long has lost a member: fail it

def master_store(master_address: str, world_size: int, port: int = 0,
                 timeout_s: float = GROUP_TIMEOUT_S) -> dist.TCPStore:
    """Rank 0's TCPStore, listening on return (port 0: one the system picks, `.port`), so the
    other ranks can be told a port nothing else can have taken in between."""
    return dist.TCPStore(master_address, port, world_size, is_master=True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


class WeightUpdateGroup:
    """A process group of its own: TCPStore rendezvous at master_address:master_port (rank 0
    may pass its `master_store`)."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 backend: str = "gloo", group_name: str = "weight_update_group",
                 timeout_s: float = GROUP_TIMEOUT_S, store: dist.TCPStore | None = None):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend, self.group_name = rank, world_size, backend, group_name
        self.aborted = False
        self._tcp_store = store or dist.TCPStore(master_address, int(master_port), world_size,
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
        pg = self.pg
        if pg is None:
            raise RuntimeError(f"weight update group {self.group_name} is destroyed")
        pg.broadcast([tensor], opts).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()
        if self.aborted:  # an aborted NCCL collective returns, with whatever the buffer holds
            raise RuntimeError(f"weight update group {self.group_name} was aborted")

    def abort(self) -> None:
        """From any thread: end this group. An NCCL wait inside `broadcast` returns at once (its
        communicators are aborted) and raises; torch cannot abort a gloo wait, which ends at the
        timeout and raises. Either way nothing it received is used."""
        self.aborted = True
        pg, self.pg, self._tcp_store = self.pg, None, None
        abort = getattr(pg, "abort", None)
        if abort is not None and self.backend == "nccl":
            abort()

    def destroy(self) -> None:
        self.abort()


def receive_flattened(group: WeightUpdateGroup, entries: list[FlatEntry], device
                      ) -> list[tuple[str, torch.Tensor]]:
    """One broadcast of the whole bucket as bytes (load_format "flattened_bucket")."""
    buf = torch.empty(_nbytes(entries), dtype=torch.uint8, device=device)
    group.broadcast(buf, src=0)
    return unflatten(buf, entries)


def receive_each(group: WeightUpdateGroup, entries: list[FlatEntry], device
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """One broadcast per tensor (SGLang's default protocol)."""
    for e in entries:
        t = torch.empty(e.shape, dtype=e.dtype, device=device)
        group.broadcast(t, src=0)
        yield e.name, t


def create_weight_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                               backend: str = "gloo", group_name: str = "weight_update_group",
                               timeout_s: float = GROUP_TIMEOUT_S,
                               store: dist.TCPStore | None = None):
    """Trainer-side entry point (rank 0): the same group the server joins."""
    return WeightUpdateGroup(master_address, master_port, rank, world_size, backend, group_name,
                             timeout_s, store)
