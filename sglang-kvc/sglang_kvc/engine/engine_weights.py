"""``Engine``'s weight-update calls (SGLang's API): each hands its request to the engine's
``WeightUpdater`` (weights/updates.py), which checks it and loads it on the engine thread. Kept
apart from engine.py so ``Engine`` itself holds only building the engine and serving requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..weights.updates import WeightUpdater
    from .output import OutputBuilder


class EngineWeights:
    """Mixed into ``Engine``, which sets ``weights`` (the updater) and ``outputs`` (whose
    ``weight_version`` every response reports)."""

    weights: WeightUpdater
    outputs: OutputBuilder

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                 weight_version: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = True) -> dict:
        return self.weights.from_disk(model_path, load_format, weight_version, abort_all_requests)

    def update_weights_from_tensor(self, named_tensors=None, serialized_named_tensors=None,
                                   load_format: str | None = None, weight_version: str | None = None,
                                   abort_all_requests: bool = False, flush_cache: bool = True) -> dict:
        return self.weights.from_tensor(named_tensors, serialized_named_tensors, load_format,
                                        weight_version, abort_all_requests)

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                  world_size: int, group_name: str = "weight_update_group",
                                  backend: str | None = None, timeout_s: float | None = None) -> dict:
        return self.weights.init_group(master_address, master_port, rank_offset, world_size,
                                       group_name, backend, timeout_s)

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str = "weight_update_group",
                                        weight_version: str | None = None,
                                        abort_all_requests: bool = False, flush_cache: bool = True,
                                        load_format: str | None = None) -> dict:
        return self.weights.from_distributed(names, dtypes, shapes, group_name, weight_version,
                                             abort_all_requests, load_format)

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        return self.weights.rows_by_name(name, truncate_size)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return self.weights.destroy_group(group_name)

    @property
    def weight_version(self) -> str:
        return self.outputs.weight_version

    @weight_version.setter
    def weight_version(self, version: str) -> None:
        self.outputs.weight_version = version

    def _set_version(self, version: str) -> None:
        self.outputs.weight_version = version
