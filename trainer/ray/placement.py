"""Placement groups: one ``{"GPU": 1, "CPU": 1}`` bundle per GPU, waited for with a deadline.

Ranks take bundles in node order (then bundle index), so consecutive ranks — a tensor-parallel
group — share a node, as torchrun's node-major ranks do.
"""

from __future__ import annotations

import dataclasses
import time

from .options import RayJobError

BUNDLE = {"GPU": 1, "CPU": 1}
PROGRESS_EVERY = 15.0  # seconds between "still waiting" lines


@dataclasses.dataclass
class Reservation:
    name: str
    group: object  # ray.util.placement_group.PlacementGroup
    order: list[int]  # position r (a rank, an engine) -> bundle index
    nodes: list[str]  # node address of each position

    def strategy(self, position: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=self.order[position])


def order_bundles(bundle_nodes: dict[int, str]) -> list[int]:
    """Bundle indices grouped by node (nodes in address order), index order within a node."""
    return sorted(bundle_nodes, key=lambda i: (bundle_nodes[i], i))


def reserve(name: str, count: int, strategy: str, timeout: float) -> Reservation:
    """``count`` GPU bundles, placed within ``timeout`` seconds or an error naming the shortfall."""
    from ray.util.placement_group import placement_group

    group = placement_group([dict(BUNDLE) for _ in range(count)], strategy=strategy)
    _wait_ready(group, f"{name}: {count} bundle(s) of {BUNDLE} ({strategy})", timeout)
    order, nodes = _bundle_nodes(group)
    return Reservation(name, group, order, nodes)


def _wait_ready(group, what: str, timeout: float) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group

    deadline, begin = time.monotonic() + timeout, time.monotonic()
    ready = group.ready()
    while True:
        left = deadline - time.monotonic()
        try:
            ray.get(ready, timeout=max(0.1, min(PROGRESS_EVERY, left)))
            return
        except ray.exceptions.GetTimeoutError:
            pass
        if time.monotonic() >= deadline:
            remove_placement_group(group)
            raise RayJobError(f"{what} not placed within {timeout:.0f}s; {free_resources()} "
                              f"(STRICT_PACK needs them all on one node; raise "
                              f"--placement-timeout if nodes are still joining)")
        print(f"[ray] waiting for {what}: {time.monotonic() - begin:.0f}s of {timeout:.0f}s; "
              f"{free_resources()}", flush=True)


def free_resources() -> str:
    """What the cluster has free now, and each node's size."""
    import ray

    free = ray.available_resources()
    nodes = [f"{n['NodeManagerAddress']} ({n['Resources'].get('GPU', 0):g} GPU, "
             f"{n['Resources'].get('CPU', 0):g} CPU)" for n in ray.nodes() if n.get("Alive")]
    return (f"free now: {free.get('GPU', 0):g} GPU, {free.get('CPU', 0):g} CPU; "
            f"nodes: {', '.join(nodes) or 'none'}")


def _bundle_nodes(group) -> tuple[list[int], list[str]]:
    import ray
    from ray.util import placement_group_table

    table = placement_group_table(group)["bundles_to_node_id"]
    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    bundle_nodes = {int(i): address.get(node, node) for i, node in table.items()}
    order = order_bundles(bundle_nodes)
    return order, [bundle_nodes[i] for i in order]


def release(reservation: Reservation) -> None:
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(reservation.group)
