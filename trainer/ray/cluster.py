"""Connect to a Ray cluster, or start a local one for this job.

A local cluster is one machine, so it lives on loopback (Ray's own switch for that), and on a
machine without CUDA it declares the GPU slots the job asks for: placement works as on GPUs and
the trainer ranks run on the CPU with gloo (``trainer.launch.select_device``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from pathlib import Path

from .options import RayJobError, RayOptions

ROOT = Path(__file__).resolve().parents[2]
# only small results (a URL, a rank's exit) go through Ray's object store, and a container's
# /dev/shm may be 64 MiB: do not reserve Ray's default 30% of memory for it
LOCAL_OBJECT_STORE = 512 << 20


@dataclasses.dataclass
class Cluster:
    local: bool  # started by this job (and stopped with it)
    address: str
    gpus: float
    cpus: float
    declared_gpus: bool = False  # GPU slots of a CUDA-less local cluster

    def describe(self) -> str:
        where = "local cluster" if self.local else f"cluster at {self.address}"
        fake = " (declared: no CUDA here, ranks run on the CPU)" if self.declared_gpus else ""
        return f"{where}: {self.gpus:g} GPU{fake}, {self.cpus:g} CPU"


def worker_env() -> dict[str, str]:
    """What every actor of the job needs in its environment, on any node."""
    # the repository's packages importable from a checkout too, not only from an install
    parts = (str(ROOT), str(ROOT / "sglang-kvc"), os.environ.get("PYTHONPATH"))
    path = os.pathsep.join(p for p in parts if p)
    env = {"PYTHONPATH": path,
           # Megatron's overlap of communication and compute assumes one CUDA connection
           "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "1")}
    if os.environ.get("PYTHONWARNINGS"):
        env["PYTHONWARNINGS"] = os.environ["PYTHONWARNINGS"]
    return env


def connect(opts: RayOptions, bundles: int) -> Cluster:
    """``bundles``: how many {GPU, CPU} bundles the job reserves (a local cluster gets the CPUs)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every rank's lines, not "[repeated 2x]"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a job sends nothing off the cluster
    # "(TrainerRank0 pid=...)" prefixes in colour on a terminal only, not in log files
    os.environ.setdefault("RAY_COLOR_PREFIX", "1" if sys.stdout.isatty() else "0")
    if opts.ray_address:
        return _attach(opts.ray_address, opts.ray_connect_timeout)
    # set before ray is imported: a one-machine cluster on 127.0.0.1, nothing on the network
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return _start_local(opts, bundles)


def _attach(address: str, timeout: float) -> Cluster:
    import ray

    hint = ("start the head with `ray start --head` (reachable from this host), or leave "
            "--ray-address out for a local cluster")
    try:
        _init_within(timeout, address=address, runtime_env={"env_vars": worker_env()},
                     log_to_driver=True)
    except TimeoutError:
        raise RayJobError(f"--ray-address {address}: no answer from the cluster within "
                          f"{timeout:.0f}s (--ray-connect-timeout); {hint}") from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise RayJobError(f"--ray-address {address}: cannot connect ({type(e).__name__}: "
                          f"{first}); {hint}") from None
    total = ray.cluster_resources()
    return Cluster(False, address, total.get("GPU", 0), total.get("CPU", 0))


def _init_within(timeout: float, **kwargs) -> None:
    """``ray.init`` with a deadline: Ray retries an unreachable head for ever. It runs in a
    daemon thread, left behind (the job then exits) when the deadline passes."""
    import ray

    done, errors = threading.Event(), []

    def init():
        try:
            ray.init(**kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=init, name="ray-connect", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError
    if errors:
        raise errors[0]


def _start_local(opts: RayOptions, bundles: int) -> Cluster:
    cuda = _cuda_count()
    gpus = opts.local_num_gpus if opts.local_num_gpus is not None else (cuda or opts.gpus_needed)
    # each bundle holds one CPU; actors mostly wait on their GPU, so declare at least enough
    cpus = max(os.cpu_count() or 1, bundles + 1)
    planned = Cluster(True, "local", gpus, cpus, declared_gpus=cuda == 0 and gpus > 0)
    check_capacity(planned, opts)  # its size is known: fail before starting anything
    import ray

    # "local": a new cluster even when `ray start` left one (or its address file) on this machine
    ray.init(address="local", num_cpus=cpus, num_gpus=gpus, include_dashboard=False,
             object_store_memory=LOCAL_OBJECT_STORE, runtime_env={"env_vars": worker_env()},
             log_to_driver=True)
    return planned


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_capacity(cluster: Cluster, opts: RayOptions) -> None:
    """Fail now, naming the flags, when the whole cluster has fewer GPUs than the job needs."""
    if cluster.gpus >= opts.gpus_needed:
        return
    parts = [f"--actor-num-nodes {opts.actor_num_nodes} x --actor-num-gpus-per-node "
             f"{opts.actor_num_gpus_per_node} trainer GPU(s)"]
    if not opts.colocate:
        parts.append(f"--rollout-num-gpus {opts.rollout_num_gpus} engine GPU(s)")
    hint = ("; --local-num-gpus sets what a local cluster declares" if cluster.local
            else "; add nodes with `ray start --address ...`")
    raise RayJobError(f"the {cluster.describe()} has {cluster.gpus:g} GPU(s) but the job needs "
                      f"{opts.gpus_needed}: {' + '.join(parts)}{hint}")


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
