"""Device memory that keeps its address when it is given back: CUDA virtual memory management.

Why: a captured decode graph reads and writes the KV pool through addresses baked in at
capture. The colocated trainer releases the pool after each rollout (its memory goes to the
update) and resumes it before the next; a pool from the caching allocator comes back wherever
the allocator finds room, and every decode graph is then captured again: 17 graphs in 3.03 s of
a 15.5 s dense rollout on an H200 (docs/benchmarks.md, 2026-11-29). Here the address range is
reserved once (`cuMemAddressReserve`) and only the physical memory behind it is given back
(`cuMemUnmap` + `cuMemRelease`) and taken again (`cuMemCreate` + `cuMemMap`), so the pool's
tensors, and the graphs captured on them, keep their address for the engine's life. This is
what SGLang's torch_memory_saver does with a preloaded allocator hook; here it is a few driver
calls through ctypes, for the one buffer that needs it.

The invariant: between `unmap` and `map` nothing may touch the range (any kernel doing so
faults). `KVPool.release` drops its tensors first and the engine runs nothing while released;
`unmap` synchronizes the device first. A range dropped without `close` (an engine torn down)
is not unmapped by the garbage collector, which may run in the middle of another thread's graph
capture, where a device sync is illegal: it is queued and closed at the next range's creation
or `map`, or at exit.
The mapped bytes are not in torch's caching allocator, so `mapped_bytes` reports them for
whoever sizes memory by `torch.cuda.memory_allocated` (model_runner.kv_pool_slots).
"""

from __future__ import annotations

import atexit
import ctypes
import weakref
from dataclasses import dataclass

import torch

_MAPPED: dict[int, int] = {}  # device index -> bytes mapped by live StableMemory ranges
_DROPPED: list[_Range] = []  # ranges whose object was collected, closed at the next safe point


class DriverError(RuntimeError):
    pass


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _LOCATION_DEVICE, _READ_WRITE, _GRANULARITY_RECOMMENDED = 1, 1, 3, 1
_OUT_OF_MEMORY = 2
_driver: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(result: int, call: str) -> None:
    if result == 0:
        return
    name = ctypes.c_char_p()
    _lib().cuGetErrorName(result, ctypes.byref(name))
    what = name.value.decode() if name.value else str(result)
    if result == _OUT_OF_MEMORY:
        raise torch.cuda.OutOfMemoryError(f"{call}: {what} (the KV pool's physical memory)")
    raise DriverError(f"{call} failed: {what}")


def available(device: torch.device) -> bool:
    """Whether this process can reserve stable ranges on `device` (a CUDA device whose driver
    has the VMM calls)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        lib = _lib()
        return all(hasattr(lib, f) for f in ("cuMemAddressReserve", "cuMemCreate", "cuMemMap",
                                              "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"))
    except OSError:
        return False


def mapped_bytes(device: torch.device) -> int:
    """Bytes that live stable ranges have mapped on `device` (not in torch's allocator stats)."""
    return _MAPPED.get(_index(device), 0)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@dataclass
class _Range:
    device: int
    base: int  # the reserved virtual address (0: freed)
    size: int  # reserved = mapped bytes, a multiple of the granularity
    handle: int | None = None  # the physical allocation mapped there, None while unmapped

    def unmap(self) -> None:
        if self.handle is None:
            return
        torch.cuda.synchronize(self.device)  # no queued kernel may still read the range
        _check(_lib().cuMemUnmap(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size)), "cuMemUnmap")
        _check(_lib().cuMemRelease(ctypes.c_ulonglong(self.handle)), "cuMemRelease")
        self.handle = None
        _MAPPED[self.device] -= self.size

    def close(self) -> None:
        self.unmap()
        if self.base:
            _check(_lib().cuMemAddressFree(ctypes.c_ulonglong(self.base), ctypes.c_size_t(self.size)),
                   "cuMemAddressFree")
            self.base = 0


def close_dropped() -> None:
    """Close the ranges whose objects were collected (see the module's docstring)."""
    while _DROPPED:
        _DROPPED.pop().close()


atexit.register(close_dropped)


class StableMemory:
    """`nbytes` of device memory at an address fixed for this object's life: `tensor()` views it
    while mapped; `unmap()` gives the physical memory back, `map()` takes it again (zeroed)."""

    def __init__(self, nbytes: int, device: torch.device):
        close_dropped()
        self.device = torch.device("cuda", _index(device))
        self.nbytes = nbytes
        self._prop = self._allocation_prop()
        size = _round_up(nbytes, self._granularity())
        self.range = _Range(self.device.index, self._reserve(size), size)
        weakref.finalize(self, _DROPPED.append, self.range)

    @property
    def mapped(self) -> bool:
        return self.range.handle is not None

    @property
    def address(self) -> int:
        return self.range.base

    def map(self) -> None:
        """Back the range with new physical memory and zero it."""
        if self.mapped:
            return
        close_dropped()
        self._make_current()
        handle = ctypes.c_ulonglong()
        _check(_lib().cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.range.size),
                                  ctypes.byref(self._prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        try:
            self._map_handle(handle.value)
        except Exception:
            _lib().cuMemRelease(handle)
            raise
        self.range.handle = handle.value
        _MAPPED[self.device.index] = _MAPPED.get(self.device.index, 0) + self.range.size
        self.tensor(torch.uint8).zero_()

    def unmap(self) -> None:
        """Give the physical memory back; the address stays reserved for the next `map`."""
        self.range.unmap()

    def close(self) -> None:
        """Unmap and free the address range (the object is unusable after)."""
        self.range.close()

    def tensor(self, dtype: torch.dtype, offset: int = 0, numel: int | None = None) -> torch.Tensor:
        """A flat `dtype` view of the mapped range from byte `offset` (`numel` elements, default
        as many as fit in `nbytes`)."""
        assert self.mapped, "the range is unmapped: map() first"
        size = torch.empty((), dtype=dtype).element_size()
        assert offset % size == 0
        numel = (self.nbytes - offset) // size if numel is None else numel
        assert offset + numel * size <= self.nbytes
        raw = torch.as_tensor(_CudaArray(self.range.base + offset, numel * size), device=self.device)
        return raw.view(dtype)

    def _make_current(self) -> None:
        # The driver calls act on the calling thread's current context; torch's runtime calls
        # make the device's primary context current on this thread.
        torch.cuda.synchronize(self.device)

    def _allocation_prop(self) -> _AllocationProp:
        prop = _AllocationProp()
        prop.type = _PINNED
        prop.location = _Location(_LOCATION_DEVICE, self.device.index)
        return prop

    def _granularity(self) -> int:
        gran = ctypes.c_size_t()
        _check(_lib().cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self._prop),
                                                    _GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity")
        return gran.value

    def _reserve(self, size: int) -> int:
        self._make_current()
        base = ctypes.c_ulonglong()
        _check(_lib().cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                          ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)),
               "cuMemAddressReserve")
        return base.value

    def _map_handle(self, handle: int) -> None:
        base, size = ctypes.c_ulonglong(self.range.base), ctypes.c_size_t(self.range.size)
        _check(_lib().cuMemMap(base, size, ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                               ctypes.c_ulonglong(0)), "cuMemMap")
        access = _AccessDesc(_Location(_LOCATION_DEVICE, self.device.index), _READ_WRITE)
        result = _lib().cuMemSetAccess(base, size, ctypes.byref(access), ctypes.c_size_t(1))
        if result:
            _lib().cuMemUnmap(base, size)
            _check(result, "cuMemSetAccess")


class _CudaArray:
    """A raw device byte range as `__cuda_array_interface__` (how torch wraps memory it did not
    allocate without copying)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple
