"""Where this run's engines are, decided here and nowhere else: the one place that reads the
topology (``EngineConfig``) and turns it into objects. The loop, the manager and the rollout
sources then hold an ``Engines`` and never ask what is behind it. One caller takes these steps,
in this order (``rollout/assembly.py``):

    launched = launch_engines(cfg.engines, device)      # before the models: engine processes
    place = engine_placement(launched.config)           # which ranks generate
    engines = engines_for(launched.config, place, device)  # this rank's Engines (or NoEngines)
    sync = weight_sync_for(ws_cfg, launched.config, engines, work_dir)
    connect_restarts(engines, launched.restart_hook(launcher_hook), sync)

The five placements: an in-process engine per GPU (or per data-parallel replica), in-process ones
as child processes (``--rollout-engine-process``), engine processes on GPUs of their own
(``--rollout-num-gpus``), servers (``--rollout-server-urls``), and a Ray job's engine actors
(given to the trainer as ``--rollout-server-urls``, restarted through the launcher's hook).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from .config import EngineConfig, WeightSyncConfig
from .failover import RestartHook
from .fleet import EngineFleet
from .inprocess import start_engine
from .interface import Engines, NoEngines
from .processes import engine_processes
from .servers import HTTPRollout
from .sharding import Placement, placement
from .sync_choice import settle_for_servers
from .weight_sync import WeightSync

# Given ``WeightSync.resync``, the hook that replaces a dead engine, or None (it stays down).
RestartHookFactory = Callable[[Callable[[str], None]], RestartHook | None]


@dataclasses.dataclass
class Launched:
    """What runs before the trainer's models load: the engine processes this rank started (none
    for in-process engines or servers), and the config pointed at every engine's URL."""

    config: EngineConfig
    fleet: EngineFleet | None = None

    def restart_hook(self, launcher: RestartHookFactory | None) -> RestartHookFactory | None:
        """Who replaces a dead engine: the launcher's hook (Ray), else this rank's processes."""
        return launcher or (self.fleet and self.fleet.restart_hook)

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()


def launch_engines(cfg: EngineConfig, device: str) -> Launched:
    """``--rollout-engine-process`` / ``--rollout-num-gpus``: their processes, up (a startup
    phase); otherwise nothing starts here."""
    fleet, config = engine_processes(cfg, device)
    return Launched(config, fleet)


def engine_placement(cfg: EngineConfig) -> Placement:
    """This rank's role in generation (Megatron's parallel state must exist)."""
    return placement(cfg.remote, cfg.per_gpu)


def describe(cfg: EngineConfig, place: Placement) -> str:
    """The startup phase's name for these engines."""
    if cfg.remote:
        return f"{len(cfg.server_urls)} rollout server(s)"
    return (f"{place.num_generators} colocated rollout engine(s), one per "
            + ("GPU" if cfg.per_gpu else "data-parallel replica"))


def generation_gpus(cfg: EngineConfig, world_size: int) -> int | None:
    """GPUs that generate: the engines' own (``--rollout-num-gpus``), else the job's
    (colocated); None for servers elsewhere (``--rollout-server-urls``: count unknown)."""
    if cfg.num_gpus:
        return cfg.num_gpus
    return None if cfg.remote else world_size


def engines_for(cfg: EngineConfig, place: Placement, device: str) -> Engines:
    """This rank's ``Engines`` under ``cfg``."""
    return open_engines(place, server_args=None if cfg.remote else cfg.server_args(device),
                        server_urls=cfg.server_urls, offload=cfg.offloads())


def open_engines(place: Placement, *, server_args=None, server_urls: list[str] | None = None,
                 offload: bool = False) -> Engines:
    """None to talk to where this rank does not generate; the servers at ``server_urls``; else
    an in-process engine from ``server_args`` (offloading its KV pool while training)."""
    if not place.generates:
        return NoEngines()
    if server_urls:
        return HTTPRollout(server_urls)
    return start_engine(server_args, progress=place.index == 0, offload=offload)


def weight_sync_for(ws: WeightSyncConfig, cfg: EngineConfig, engines: Engines, work_dir: Path
                    ) -> WeightSync:
    """How the trainer's weights reach ``engines`` (``--weight-sync``): the in-process engine,
    or the servers (the engines behind a router, ``--rollout-engine-urls``, since a router
    forwards generation only)."""
    hosted = engines if engines.hosted else None
    door = cfg.weights_door(hosted)
    ws = settle_for_servers(ws, door)  # auto: IPC first for a server on the trainer's own GPU
    return WeightSync(ws.mode, engines=door,
                      bucket_bytes=ws.bucket_bytes, disk_dir=work_dir / "weight_sync",
                      hf_config_dir=cfg.model_path, group_timeout_s=ws.timeout_s,
                      fallback=ws.fallback,
                      master_address=ws.master_address
                      or os.environ.get("MASTER_ADDR", "127.0.0.1"))


def connect_restarts(engines: Engines, hook: RestartHookFactory | None, sync: WeightSync) -> None:
    """A dead engine is replaced by ``hook`` and re-synced (``sync.resync``); without a hook
    it stays down. Only HTTP engines fail over; the others ignore it."""
    if hook is not None:
        engines.on_engine_failure = hook(sync.resync)
