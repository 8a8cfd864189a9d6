"""This node's address and a free port on it (for rendezvous, engines and the router)."""

from __future__ import annotations

from ..rollout.engines.lifecycle import free_port  # noqa: F401 - this node's engines, router, rendezvous


def node_ip() -> str:
    """The address Ray knows this node by (127.0.0.1 in a local cluster)."""
    import ray

    return ray.util.get_node_ip_address()


def local_gpu_index(gpu_ids: list, visible: str | None) -> int:
    """The CUDA index of Ray's GPU id in this process, which sees every GPU of the node
    (``CUDA_VISIBLE_DEVICES`` left as the node has it, so NCCL sees its peers)."""
    if not gpu_ids:
        return 0
    gpu = str(gpu_ids[0])
    listed = [v.strip() for v in visible.split(",")] if visible else []
    return listed.index(gpu) if gpu in listed else int(gpu)
