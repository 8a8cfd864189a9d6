"""Run Megatron-core on CPU (gloo): the whole compatibility layer, in one place.

Megatron-core 0.16 assumes CUDA in a few ways that matter for tests and laptop debugging:
  1. its RNG tracker (``model_parallel_cuda_manual_seed``, ``get_cuda_rng_tracker().fork()``)
     saves and restores ``torch.cuda`` RNG state;
  2. it calls ``torch.cuda.synchronize`` / ``torch.cuda.current_device()``;
  3. it creates small tensors with ``device="cuda"`` (optimizer scales, grad-norm buffers,
     checkpoint status flags), moves tensors with ``.cuda()`` (tied embeddings under PP) and
     asserts ``tensor.type() == 'torch.cuda.FloatTensor'`` (grad clipping);
  4. with ``attention_mask=None`` the local-spec attention builds its causal mask on ``cuda``.
Only when CUDA is absent, we stand in the CPU generator for (1), no-ops for (2), and for (3) a
``TorchFunctionMode`` that turns every request for a CUDA tensor into a CPU tensor (and reports
CPU tensors' type names as CUDA ones); callers pass
an explicit mask for (4) (``causal_attention_mask``). Nothing here changes behaviour on a machine
with a GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import time

import torch
import torch.distributed as dist

from .runtime import default_device, free_port, teardown  # noqa: F401 - the converters' and tests' names

_PATCHED = False


def _is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int)  # a bare index means a CUDA ordinal


class _CudaRequestsToCpu(torch.overrides.TorchFunctionMode):
    """Serve ``device="cuda"`` factories, ``.cuda()`` and ``.to("cuda")`` on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # grad clipping asserts ``grad.type() == 'torch.cuda.FloatTensor'``
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def install_cpu_stand_ins() -> None:
    """Route Megatron's ``torch.cuda`` RNG/sync calls to CPU equivalents when there is no GPU."""
    global _PATCHED
    if _PATCHED or cuda_available():
        return
    from megatron.core.tensor_parallel import random as mcore_random

    def get_state(device="cuda", clone=False, graph_safe=False):
        state = torch.get_rng_state()
        return state.clone() if clone else state

    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    mcore_random._get_cuda_rng_state = get_state
    mcore_random._set_cuda_rng_state = set_state
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: None  # the CPU generator is seeded by the caller
    torch.cuda.manual_seed_all = lambda seed: None
    torch.cuda.synchronize = lambda device=None: None
    # The mode stack is per thread; Megatron creates its CUDA tensors on the calling thread.
    _CudaRequestsToCpu().__enter__()
    torch.cuda.current_device = lambda: torch.device("cpu")
    _PATCHED = True


def causal_attention_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Megatron's mask convention: ``True`` marks a position that may NOT be attended."""
    return torch.triu(torch.ones(1, 1, seq_len, seq_len, dtype=torch.bool, device=device), 1)


def init_distributed(
    rank: int = 0,
    world_size: int = 1,
    *,
    master_port: int | None = None,
    backend: str | None = None,
) -> None:
    """Initialise the default process group (gloo on CPU, NCCL on GPU) if it is not up yet.

    One rank without ``master_port`` gets an in-memory store: no port and no launcher variables
    are read, so a tool run under (or spawned by) torchrun never joins that job's rendezvous."""
    install_cpu_stand_ins()
    if dist.is_initialized():
        return
    backend = backend or ("nccl" if cuda_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = datetime.timedelta(minutes=10)
    if master_port is None and world_size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
        return
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = master_port if master_port is not None else int(os.environ["MASTER_PORT"])
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=world_size, timeout=timeout)


def init_model_parallel(tp: int = 1, pp: int = 1, seed: int = 1234) -> None:
    """Set up Megatron's parallel state and seeded RNG tracker on the current process group."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    install_cpu_stand_ins()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


@contextlib.contextmanager
def single_process_group():
    """A one-rank process group for tools that need ``torch.distributed`` but run alone."""
    owned = not dist.is_initialized()
    if owned:
        init_distributed(0, 1, backend="gloo")
    try:
        yield
    finally:
        if owned:
            teardown()


def _resolve_task(task):
    """A callable, or ``(path_to_file.py, function_name)`` for functions of modules that a
    spawned child cannot import by name (e.g. test files)."""
    if callable(task):
        return task
    import importlib.util

    path, name = task
    spec = importlib.util.spec_from_file_location(f"_rank_task_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _rank_main(task, rank, world, port, args, results) -> None:
    try:
        value = _resolve_task(task)(rank, world, port, *args)
        results.put((rank, value))
        if dist.is_initialized():
            dist.barrier()
    except BaseException as e:  # report to the parent instead of leaving it waiting
        results.put((rank, RuntimeError(f"rank {rank}: {type(e).__name__}: {e}")))
        raise
    finally:
        teardown()


def run_on_ranks(task, world: int, *args, timeout: float = 600) -> list:
    """Run ``task(rank, world, port, *args)`` in ``world`` spawned processes (the task calls
    ``init_distributed(rank, world, master_port=port)``); return the per-rank results in rank
    order. An error on any rank is raised here."""
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(task, r, world, port, args, results))
             for r in range(world)]
    for p in procs:
        p.start()
    values: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world:
            try:
                rank, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in values]
                if dead:  # e.g. the task could not even be unpickled in the child
                    raise RuntimeError(f"rank {dead[0]} exited with code "
                                       f"{procs[dead[0]].exitcode} before reporting a result")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks did not finish within {timeout:.0f}s")
                continue
            if isinstance(value, BaseException):
                raise value
            values[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [values[r] for r in range(world)]
