"""``ModelRunner``'s weights and memory: loading new weights into the model, and releasing /
resuming its device memory (the KV pool, the weights, the decode graphs) for the engine's
``release_memory`` / ``resume_memory`` (engine_memory.py). Kept apart from model_runner.py so
the runner itself holds only building the parts and running a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..weights.loader import load_named_tensors

if TYPE_CHECKING:
    from ..kvcache.kv_cache import KVCache
    from ..models.causal_lm import CausalLM
    from .cuda_graph import DecodeGraphs
    from .prefill_graph import PrefillGraphs


class RunnerMemory:
    """Mixed into ``ModelRunner``, which sets what these calls move: ``model``, ``kv`` (its
    pool), ``graphs`` and ``prefill_graphs`` (None: none) and ``device``."""

    model: CausalLM
    kv: KVCache
    graphs: DecodeGraphs | None
    prefill_graphs: PrefillGraphs | None
    device: torch.device

    def _all_graphs(self) -> list:
        return [g for g in (self.graphs, self.prefill_graphs) if g is not None]

    @torch.inference_mode()
    def load_weights(self, named) -> int:
        # Cached KV was computed with the old weights: no request may match it again (a failed
        # load may have changed some tensors, so this comes first).
        self.kv.flush()
        n = load_named_tensors(self.model, named)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return n

    def release(self, tags: set[str]) -> None:
        """Free the tagged memory. The decode graphs survive a KV-pool release (the trainer's
        per-rollout offload): captured again only when the pool comes back at an address it
        never had (cuda_graph.DecodeGraphs.follow_pool)."""
        if "kv_cache" in tags and self.kv.pool.allocated:
            self.kv.pool.release()
        if "weights" in tags and self.device.type == "cuda":
            self.model.to("cpu")
        if tags & {"weights", "cuda_graph"}:
            for graphs in self._all_graphs():
                graphs.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume(self, tags: set[str]) -> None:
        if "weights" in tags and self.device.type == "cuda":
            self.model.to(self.device)
        if "kv_cache" in tags and not self.kv.pool.allocated:
            if self.device.type == "cuda":  # the trainer's cache to the driver first: the pool's
                torch.cuda.empty_cache()  # best chance at its old address, graphs kept (issue 60)
            self.kv.pool.allocate()
            self.kv.reset()
        for graphs in self._all_graphs():  # the graphs of the pool's new address, kept or none yet
            graphs.follow_pool()
