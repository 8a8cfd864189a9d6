"""Count, on the CPU, the host<->device synchronisations a block of trainer code would make on a
GPU: every read of a device tensor's values by the host, and every host-to-device copy the
host has to wait for.

On a CPU-only machine every tensor lives on the host, so nothing syncs and nothing tells which
tensors a GPU run would hold on the device. ``HostSyncCounter`` keeps that distinction itself:

* a tensor is *on the device* when it is a model parameter, gradient or buffer (``mark_module``),
  a copy made by ``.to(cuda)`` / ``.cuda()`` / a factory with ``device="cuda"`` (served on the
  host; point ``trainer.launch.default_device`` at "cuda" so the learner asks for them), or the result of any operation with a device input (a
  ``TorchDispatchMode`` sees every aten op, the backward's included); such a tensor reports
  ``device == cuda``, so code that copies "to where the logits are" keeps it on the device;
* a *sync* is what makes the CUDA host wait: a scalar read (``.item()``, ``float()``, ``int()``,
  ``bool()`` / ``if t:`` -- aten's ``_local_scalar_dense``), ``.tolist()``, ``.numpy()``, a
  blocking ``.cpu()`` / ``.to("cpu")`` (whose result is then a host tensor), an op whose output
  size depends on the values (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``,
  ``repeat_interleave`` without ``output_size``), each of a device tensor; and a host-to-device
  copy from pageable memory or without ``non_blocking`` (``torch.tensor(data, device="cuda")``
  included): the host waits for the stream's queued work before such a copy returns.

Explicit ``torch.cuda.synchronize`` calls (``speed.timed``, once per pass) are not seen: on the
CPU they are skipped before reaching torch. ``by_site()`` names where each sync came from (the
innermost frame under ``trainer/``).
"""

from __future__ import annotations

import collections
import contextlib
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# aten ops that read a device tensor's values on the host (or size their output by them)
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
            aten.repeat_interleave.Tensor, aten.equal.default, aten.is_nonzero.default}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
              aten._index_put_impl_.default}
# Tensor methods that read a device tensor on the host (on the CPU no aten op shows it)
_HOST_READS = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy"}
_FROM_DATA = {torch.tensor: "torch.tensor(data, device=cuda)",
              torch.as_tensor: "torch.as_tensor(data, device=cuda)"}
_DEVICE_GETTER = torch.Tensor.device.__get__
_CUDA = torch.device("cuda", 0)
_HERE = __file__.replace("\\", "/")


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def _is_cpu(device) -> bool:
    if isinstance(device, torch.Tensor):
        device = device.device
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu"


def _tensors(tree) -> list[torch.Tensor]:
    flat, _ = tree_flatten(tree)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class HostSyncCounter:
    """Enter to count; ``syncs`` lists (what, site) in order."""

    def __init__(self, root: str = "trainer/"):
        self.root = root
        self.syncs: list[tuple[str, str]] = []
        self.uploads: list[str] = []  # sites of host -> device copies, blocking or not
        # storage id -> storage: kept alive, so that an id is never reused by a host tensor
        self._device: dict[int, object] = {}
        self._pinned: dict[int, object] = {}
        self._stack = contextlib.ExitStack()

    # --- where tensors live ----------------------------------------------------------------------
    def mark(self, *tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._device[_storage_id(t)] = t.untyped_storage()

    def mark_module(self, module: torch.nn.Module) -> None:
        """Parameters (with Megatron's ``main_grad``, a view of DDP's buffer), buffers, and
        tensors modules keep as plain attributes (RoPE's ``inv_freq``)."""
        for p in module.parameters():
            self.mark(p, getattr(p, "main_grad", None), p.grad)
        self.mark(*torch.nn.Module.buffers(module))  # DDP's own ``buffers`` is a list
        for m in module.modules():
            self.mark(*(v for v in vars(m).values() if isinstance(v, torch.Tensor)))

    def on_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and _storage_id(t) in self._device

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        self._pinned[_storage_id(t)] = t.untyped_storage()
        return t

    def is_pinned(self, t: torch.Tensor) -> bool:
        return _storage_id(t) in self._pinned

    def host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A copy the device tensor ``t`` gave the host."""
        with torch.utils._python_dispatch._disable_current_modes():
            return t.detach().clone().requires_grad_(t.requires_grad)

    # --- counting --------------------------------------------------------------------------------
    def record(self, what: str) -> None:
        self.syncs.append((what, self._site()))

    def _site(self) -> str:
        for frame in reversed(traceback.extract_stack()):
            name = frame.filename.replace("\\", "/")
            if f"/{self.root}" in name and name != _HERE:
                return f"{name[name.index(f'/{self.root}') + 1:]}:{frame.lineno} ({frame.name})"
        return "elsewhere"

    def by_site(self) -> collections.Counter:
        return collections.Counter(f"{what} at {site}" for what, site in self.syncs)

    def upload(self) -> None:
        self.uploads.append(self._site())

    def __len__(self) -> int:
        return len(self.syncs)

    def __enter__(self):
        self._stack.enter_context(_Functions(self))
        self._stack.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False


class _Functions(TorchFunctionMode):
    """Python level: host reads of device tensors, copies between host and device."""

    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.c = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, c = dict(kwargs or {}), self.c
        if func == _DEVICE_GETTER:
            return _CUDA if c.on_device(args[0]) else func(*args)
        if func is torch.Tensor.pin_memory:  # no pinned memory without CUDA: a marked copy
            return c.pinned(args[0].clone())
        if func in _HOST_READS and c.on_device(args[0]):
            c.record(_HOST_READS[func])
        if func in (torch.Tensor.cpu, torch.Tensor.to) and c.on_device(args[0]):
            return self._to_host(func, args, kwargs)
        pin = kwargs.pop("pin_memory", False)
        to_device = _is_cuda(kwargs.get("device")) or func is torch.Tensor.cuda or (
            func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]))
        if to_device:
            self._check_upload(func, args, kwargs)
            func, args, kwargs = _on_host(func, args, kwargs)
        out = func(*args, **kwargs)
        if pin:
            c.pinned(out)
        if to_device and isinstance(out, torch.Tensor) and not c.on_device(out):
            out = out.clone() if any(out is a for a in args) else out  # .to() of itself
            c.mark(out)
        return out

    def _to_host(self, func, args, kwargs):
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        if func is torch.Tensor.to and not _is_cpu(target):
            return func(*args, **kwargs)  # a dtype change, or to the device it is on
        if not kwargs.get("non_blocking", False):
            self.c.record("cpu" if func is torch.Tensor.cpu else "to(cpu)")
        return self.c.host_copy(func(*args, **kwargs))

    def _check_upload(self, func, args, kwargs) -> None:
        """A host -> device copy the host waits for: pageable, or blocking."""
        c = self.c
        if func in _FROM_DATA:
            if not isinstance(args[0], torch.Tensor) or not c.on_device(args[0]):
                c.upload()
                c.record(_FROM_DATA[func])
            return
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is None or c.on_device(src):
            return
        c.upload()
        if not (c.is_pinned(src) and kwargs.get("non_blocking", False)):
            c.record("pageable host->device copy")


class _Dispatch(TorchDispatchMode):
    """aten level: every op with a device input has device outputs; the value-reading ones
    among them are syncs (boolean-mask indexing included)."""

    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.c = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        c = self.c
        device_in = any(c.on_device(t) for t in _tensors((args, kwargs)))
        if device_in and (func in SYNC_OPS or _bool_index(func, args)):
            c.record(str(func.overloadpacket.__name__))
        out = func(*args, **(kwargs or {}))
        if device_in:
            c.mark(*_tensors(out))
        return out


def _on_host(func, args, kwargs):
    """The call with its "cuda" served by the host."""
    if func is torch.Tensor.cuda:
        return torch.Tensor.clone, args[:1], {}
    if "device" in kwargs:
        kwargs = {**kwargs, "device": "cpu"}
    if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
        args = (args[0], "cpu", *args[2:])
    return func, args, kwargs


def _bool_index(func, args) -> bool:
    """``x[mask]`` / ``x[mask] = y`` with a boolean mask: sized by the mask's values."""
    if func not in _INDEX_OPS:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
