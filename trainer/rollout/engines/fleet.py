"""Rollout servers as child processes (``python -m sglang_kvc.launch_server``), restarted when
one dies.

    fleet = EngineFleet(FleetConfig(model_path, num_engines=2, server_args=["--device", "cpu"]))
    with fleet:                                        # starts all, waits for /health; stops all
        rollout = HTTPRollout(fleet.urls, on_engine_failure=fleet.restart)
        sync = WeightSync("tensor", engines=rollout, ...)
        fleet.resync = sync.resync                     # a restarted engine gets the last weights
        rollout.generate(...)                          # a killed engine's requests go elsewhere

The restart hook (``HTTPRollout(on_engine_failure=...)``, see ``failover.py``) is a plain
function ``hook(dead_url) -> new_url | None``, called in a background thread once per failure; it
must return only when the replacement answers ``/health`` and serves the current weights, or
return None. ``EngineFleet.restart`` does that for child processes: it kills what is left of the
old process, starts one with the same arguments (same port when free, else a new one), waits for
``/health`` (at most ``start_timeout``), calls ``resync(new_url)`` (the trainer's
``WeightSync.resync``: last pushed weights and version) and returns the URL. A Ray launcher passes
its own function for its actors through the same hook.

The steps are the ones every engine takes (``lifecycle.py``): start, health, restart, re-sync,
stop.

No orphans: ``stop()`` runs on ``with`` exit and at interpreter exit, and on Linux every child
gets SIGTERM if the trainer process dies without running either (``PR_SET_PDEATHSIG``; the
children are spawned from one long-lived thread, since the signal follows the spawning thread).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from .lifecycle import die_with_parent, free_port, port_free, wait_healthy
from .restarts import SlotRestarts

log = logging.getLogger(__name__)


@dataclasses.dataclass
class FleetConfig:
    model_path: str
    num_engines: int = 1
    server_args: list[str] = dataclasses.field(default_factory=list)  # more launch_server flags
    host: str = "127.0.0.1"
    start_timeout: float = 600.0  # seconds for a (re)started engine to answer /health
    log_dir: str | None = None  # engine<i>.log (appended over restarts); default a temp dir
    env: list[dict] | None = None  # per-engine extra environment (e.g. CUDA_VISIBLE_DEVICES)
    max_restarts: int = 3  # per engine; then it stays down


@dataclasses.dataclass
class EngineProcess:
    index: int
    host: str
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class EngineFleet:
    def __init__(self, cfg: FleetConfig, resync: Callable[[str], None] | None = None):
        if cfg.num_engines < 1:
            raise ValueError("a fleet needs at least one engine")
        self.cfg, self.resync = cfg, resync
        self.engines = [EngineProcess(i, cfg.host, free_port(cfg.host))
                        for i in range(cfg.num_engines)]
        self.log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="engine-fleet-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fleet-spawn")
        self._lock = threading.Lock()
        self._stopped = False
        self.restarts = SlotRestarts(self.urls, self._replace, cfg.max_restarts, say=log.warning)
        atexit.register(self.stop)

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def start(self) -> list[str]:
        """Start every engine (in parallel) and wait until all answer /health."""
        try:
            for e in self.engines:
                self._spawn(e)
            for e in self.engines:
                self._wait_healthy(e)
        except BaseException:
            self.stop()
            raise
        return self.urls

    def restart(self, url: str) -> str | None:
        """The ``on_engine_failure`` hook: a new process for the engine that served ``url``
        (which report restarts, how often, and the re-sync: ``restarts.SlotRestarts``)."""
        return self.restarts.restart(url, self.resync)

    def _replace(self, slot: int) -> str:
        engine = self.engines[slot]
        _end(engine.proc)  # a hung process must not keep the port or its memory
        if not port_free(engine.host, engine.port):
            engine.port = free_port(engine.host)
        self._spawn(engine)
        self._wait_healthy(engine)
        return engine.url

    def restart_hook(self, resync: Callable[[str], None]) -> Callable[[str], str | None]:
        """The trainer's restart-hook factory (``factory.RestartHookFactory``): replacements get
        ``resync`` (the run's last weights), failures go to ``restart``."""
        self.resync = resync
        return self.restart

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.restarts.close()
        for e in self.engines:
            if e.proc is not None and e.proc.poll() is None:
                e.proc.terminate()
        for e in self.engines:
            _end(e.proc)
        self._spawner.shutdown(wait=False)
        atexit.unregister(self.stop)

    def __enter__(self) -> "EngineFleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- one engine --------------------------------------------------------------------------
    def log_path(self, engine: EngineProcess) -> Path:
        return self.log_dir / f"engine{engine.index}.log"

    def _argv(self, engine: EngineProcess) -> list[str]:
        return [sys.executable, "-m", "sglang_kvc.launch_server", "--model-path",
                str(self.cfg.model_path), "--host", engine.host, "--port", str(engine.port),
                *self.cfg.server_args]

    def _spawn(self, engine: EngineProcess) -> None:
        env = {**os.environ, **(self.cfg.env[engine.index] if self.cfg.env else {})}
        with self._lock:
            if self._stopped:
                raise RuntimeError("the engine fleet is stopped")
            with self.log_path(engine).open("a") as out:
                # from the spawner thread: PR_SET_PDEATHSIG fires when the spawning thread ends;
                # a session of its own: Ctrl-C is the trainer's, which stops its engines
                engine.proc = self._spawner.submit(
                    subprocess.Popen, self._argv(engine), stdout=out, stderr=subprocess.STDOUT,
                    env=env, preexec_fn=die_with_parent, start_new_session=True).result()

    def _wait_healthy(self, engine: EngineProcess) -> None:
        if not wait_healthy([engine.url], self.cfg.start_timeout,
                            check=lambda: self._check_running(engine)):
            return
        _end(engine.proc)
        raise TimeoutError(f"rollout engine {engine.index} ({engine.url}) did not answer /health "
                           f"within {self.cfg.start_timeout:g} s (FleetConfig.start_timeout); "
                           f"{self._tail(engine)}")

    def _check_running(self, engine: EngineProcess) -> None:
        if engine.proc.poll() is not None:
            raise RuntimeError(f"rollout engine {engine.index} ({engine.url}) exited with code "
                               f"{engine.proc.returncode} while starting; {self._tail(engine)}")

    def _tail(self, engine: EngineProcess, lines: int = 20) -> str:
        path = self.log_path(engine)
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"the end of {path}:\n" + "\n".join(text)


def _end(proc: subprocess.Popen | None, grace: float = 30.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
