"""The in-process engine: an ``sglang_kvc.Engine`` in the trainer's process, colocated with this
rank's part of the trainer. It owns what sharing one process with training takes: the KV pool
released while training (``kv_memory``, with offload) and the CUDA-graph capture gate held by
the training thread's GPU work under async rollouts (``device_work``)."""

from __future__ import annotations

import concurrent.futures
import contextlib

from evaluation.progress import progress_bar

from .interface import Engines, Generation, RolloutConfig, RolloutError, SampleRequest, batch_body
from .interface import parse_output, reissue_failed


def start_engine(server_args, progress: bool = False, offload: bool = False) -> "EngineRollout":
    """An engine built from ``server_args`` (``EngineConfig.server_args``), in this process."""
    from sglang_kvc import Engine

    return EngineRollout(Engine(server_args=server_args), progress=progress, offload=offload)


class EngineRollout(Engines):
    """An in-process engine, colocated with this rank's part of the trainer."""

    def __init__(self, engine, progress: bool = False, offload: bool = False):
        self.engine = engine
        self.progress = progress  # a bar of finished samples (one rank shows it)
        self.offload = offload  # the KV pool exists only while generating

    @property
    def name(self) -> str:
        return f"rollout engine on {self.engine.device}"

    def run(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        return reissue_failed(lambda reqs: self._run_once(reqs, cfg), requests, self.name)

    def _run_once(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        try:
            futures = self.engine.submit_generate(batch_body(requests, cfg))
        except RuntimeError as e:  # its thread died: nothing here can run them
            raise RolloutError(f"{self.name}: {e}") from e
        with progress_bar(total=len(requests), desc="generate", unit="sample", leave=False,
                  disable=not self.progress, mininterval=1.0) as bar:
            for _ in concurrent.futures.as_completed(futures):
                bar.update()
        return [parse_output(f.result(), cfg.eviction_record) for f in futures]

    def update_weights(self, path: str, payload: dict, urls: list[str]) -> list[str]:
        """``/update_weights_from_tensor`` with ``named_tensors``: same process, same device,
        the engine copies straight from the trainer's tensors."""
        if path != "/update_weights_from_tensor":
            raise RuntimeError(f"{self.name} takes its weights as tensors, not {path}")
        self.engine.update_weights_from_tensor(**payload)
        return []

    def submit(self, request: SampleRequest, cfg: RolloutConfig
               ) -> "concurrent.futures.Future[Generation]":
        """One request into the engine's queue: its scheduler adds it to the running batch."""
        return self.submit_many([request], cfg)[0]

    def submit_many(self, requests: list[SampleRequest], cfg: RolloutConfig
                    ) -> "list[concurrent.futures.Future[Generation]]":
        """Several requests in one intake: the engine thread takes them in together."""
        if not requests:
            return []
        try:
            inner = self.engine.submit_generate(batch_body(requests, cfg))
        except RuntimeError as e:  # its thread died: nothing here can run them
            raise RolloutError(f"{self.name}: {e}") from e
        return [_parsed(f, cfg.eviction_record) for f in inner]

    has_sessions = True

    def open_session(self) -> str:
        """A session whose requests continue each other's KV (multi-turn rollouts)."""
        return self.engine.open_session()

    def close_session(self, session_id: str) -> None:
        self.engine.close_session(session_id)

    def open_sessions(self, count: int) -> list[str]:
        """All of them in one hop to the engine thread."""
        return self.engine.open_sessions(count)

    def close_sessions(self, session_ids: list[str]) -> None:
        """All of them at one step boundary; ids the engine does not know are skipped."""
        try:
            self.engine.close_sessions(session_ids)
        except RuntimeError:  # its thread died: it holds nothing any more
            pass

    def pool(self) -> dict | None:
        return _pool(self.engine.get_server_info())

    def context_length(self) -> int | None:
        return self.engine.max_seq_len

    def decode_counters(self) -> dict:
        """Lifetime decode counters: steps, host and GPU-wait seconds, CUDA graph captures (a
        capture per rollout means the KV pool came back elsewhere)."""
        steps, graphs = self.engine.step_stats, self.engine.get_server_info().get("cuda_graphs", {})
        return {"rollout/decode_steps": steps.decode_steps, "rollout/decode_host_s": steps.host_s,
                "rollout/decode_gpu_wait_s": steps.gpu_wait_s,
                "rollout/graph_captures": graphs.get("captures", 0),
                "rollout/graph_capture_s": graphs.get("capture_s", 0.0),
                # async: steps run eagerly because the trainer's thread held the capture gate
                "rollout/graph_deferred_steps": graphs.get("deferred", 0)}

    def abort_all(self) -> None:
        self.engine.abort_request(abort_all=True)

    @contextlib.contextmanager
    def kv_memory(self):
        """The KV pool exists only while the engine generates (when offloading)."""
        if self.offload:
            self.engine.resume_memory(["kv_cache"])
        try:
            yield
        finally:
            if self.offload:
                self.engine.release_memory(["kv_cache"])

    def device_work(self, asynchronous: bool):
        return device_work(asynchronous, self.engine)

    def close(self) -> None:
        self.engine.shutdown()


def _parsed(inner: concurrent.futures.Future, want_record: bool) -> concurrent.futures.Future:
    """A future of the engine's output dict, as a future of its ``Generation``."""
    outer: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        try:
            outer.set_result(parse_output(f.result(), want_record))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on it
            outer.set_exception(e)

    inner.add_done_callback(done)
    return outer


def _pool(info: dict | None) -> dict | None:
    if not info or "kv_pool" not in info:
        return None
    return {k: info["kv_pool"][k] for k in ("peak_used", "bytes_per_slot", "capacity")}


def device_work(asynchronous: bool, engine):
    """Async with an engine in this process: the training thread's GPU work must not overlap
    the engine thread's CUDA-graph captures (``sglang_kvc.device_work``)."""
    if not asynchronous or engine is None:
        return contextlib.nullcontext()
    from sglang_kvc import device_work as engine_device_work

    return engine_device_work()
