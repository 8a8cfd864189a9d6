"""One door to the rollout engines, wherever they run: the ``Engines`` interface, and what goes
through it (sample requests in, ``Generation``s out).

Two implementations: ``inprocess.EngineRollout`` (an ``sglang_kvc.Engine`` in this process) and
``http.HTTPRollout`` (SGLang-API servers: a static list, this run's child processes or Ray
actors); ``NoEngines`` stands for a rank that hosts none. ``factory.py`` alone decides which one
a rank gets. Every implementation returns, per sample, the response token ids, the sampler's log-prob of each token (π_sparse:
computed over the compressed KV cache when compression is on), the finish reason, the weight
version that produced it and the engine's compression statistics.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
from typing import Callable

log = logging.getLogger(__name__)


class RolloutError(RuntimeError):
    """Samples that an engine could not generate: the rollout fails, naming the engine and its
    first error, rather than training on the empty answers of aborted samples."""


@dataclasses.dataclass
class RolloutConfig:
    max_response_len: int = 1024  # --rollout-max-response-len
    temperature: float = 1.0  # --rollout-temperature
    top_p: float = 1.0  # --rollout-top-p
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    seed: int | None = None  # per-sample sampling_seed = seed + sample index when set
    concurrency: int = 64  # in-flight HTTP requests per server
    samples_per_request: int = 256  # samples batched into one HTTP /generate request (1: one each)
    retries: int = 3
    compress: bool = True  # False: dense KV on a compressing sglang-kvc engine (dense evaluation)
    eviction_record: bool = False  # ask sglang-kvc for each sample's eviction record (replay)
    compress_budget: int | None = None  # sglang-kvc's per-request budget B (adaptive budget)
    dense_per_group: int = 0  # the first m samples of each prompt's n run dense (dense share)


@dataclasses.dataclass
class Generation:
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    weight_version: str | None
    meta: dict
    # one weight version per token when a partial rollout was resumed under new weights
    token_versions: list[int] | None = None
    # [layers, KV heads, prompt + response] int tensor: the first query that lost each key
    # (sglang_kvc.compression.eviction_record), when the rollout asked for it
    eviction_record: object | None = None


def _kv_fields(cfg: RolloutConfig) -> dict:
    """sglang-kvc's per-request ``compress`` field, sent only when it asks for dense KV (a stock
    SGLang server never sees it in a default run)."""
    fields = {} if cfg.compress else {"compress": False}
    if cfg.compress_budget is not None:
        fields["compress_budget"] = cfg.compress_budget
    if cfg.eviction_record:
        fields["return_eviction_record"] = True
    return fields


def _sampling_params(cfg: RolloutConfig, seed: int | None, **overrides) -> dict:
    # every truncation explicit: a model's generation_config must not slip in a min_p
    params = {"max_new_tokens": cfg.max_response_len, "temperature": cfg.temperature,
              "top_p": cfg.top_p, "top_k": cfg.top_k, "min_p": 0.0, "no_stop_trim": True,
              "skip_special_tokens": False, "spaces_between_special_tokens": False}
    if cfg.stop_token_ids:
        params["stop_token_ids"] = cfg.stop_token_ids
    if seed is not None:
        params["sampling_seed"] = seed
    params.update(overrides)
    return params


@dataclasses.dataclass
class SampleRequest:
    """One sample to generate: what an SGLang ``/generate`` request carries for it. Its
    ``sampling_seed`` goes with it, so it is the same sample on whichever engine runs it."""
    input_ids: list[int]
    sampling_params: dict
    compress: bool = True  # False: this sample keeps its whole KV (dense share)
    session_params: dict | None = None  # {"id", "rid"}: continue a session's KV (multi-turn)

    @classmethod
    def of(cls, input_ids: list[int], cfg: RolloutConfig, seed: int | None, **overrides
           ) -> "SampleRequest":
        return cls(list(input_ids), _sampling_params(cfg, seed, **overrides))


def sample_requests(prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                    ) -> list[SampleRequest]:
    """``n`` samples of each prompt, in order; sample ``k`` is seeded ``cfg.seed + k``."""
    out = []
    for i, ids in enumerate(prompts):
        for j in range(n):
            seed = None if cfg.seed is None else cfg.seed + i * n + j
            out.append(SampleRequest.of(ids, cfg, seed, **overrides))
            out[-1].compress = j >= cfg.dense_per_group
    return out


def batch_body(requests: list[SampleRequest], cfg: RolloutConfig) -> dict:
    """One batched ``/generate`` body (SGLang takes lists of ``input_ids`` and of
    ``sampling_params``)."""
    return {"input_ids": [r.input_ids for r in requests],
            "sampling_params": [r.sampling_params for r in requests],
            "return_logprob": True, **_kv_fields(cfg), **_per_sample_compress(requests, cfg),
            **({"session_params": [r.session_params for r in requests]}
               if any(r.session_params for r in requests) else {})}


def _per_sample_compress(requests: list[SampleRequest], cfg: RolloutConfig) -> dict:
    """A mixed batch (dense share) says per sample which ones compress."""
    if all(r.compress for r in requests):
        return {}
    return {"compress": [cfg.compress and r.compress for r in requests]}


class Backend:
    """What generation needs of an engine: ``run`` a list of sample requests, in order;
    ``submit`` one request that joins whatever the engine is running (episodes advance on their
    own); sessions that keep a request's KV for the next one (``open_session``, a request whose
    ``session_params`` name it continues it, ``close_session``)."""

    has_sessions = False  # True: open_session / close_session work on every request's engine

    def run(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                 ) -> list[Generation]:
        return self.run(sample_requests(prompts, n, cfg, **overrides), cfg)

    def submit(self, request: SampleRequest, cfg: RolloutConfig
               ) -> "concurrent.futures.Future[Generation]":
        """One request, answered through a future. An engine that batches requests in flight
        overrides it (they then share its decode steps); here it runs at once, alone."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(self.run([request], cfg)[0])
        except Exception as e:  # noqa: BLE001 - handed to whoever waits on it
            future.set_exception(e)
        return future

    def submit_many(self, requests: list[SampleRequest], cfg: RolloutConfig
                    ) -> "list[concurrent.futures.Future[Generation]]":
        """``submit`` for each request; an engine that takes several in one call overrides it
        (one intake, one hop to its thread)."""
        return [self.submit(r, cfg) for r in requests]

    def open_session(self) -> str:
        """A session id: requests naming it continue each other's KV on one engine."""
        raise RolloutError(f"{type(self).__name__} has no sessions")

    def close_session(self, session_id: str) -> None:
        """Free what the session holds (an id the engine no longer knows holds nothing)."""
        raise RolloutError(f"{type(self).__name__} has no sessions")

    def open_sessions(self, count: int) -> list[str]:
        """``count`` sessions at once (a rollout's episodes); engines that can open them in one
        round trip override it."""
        return [self.open_session() for _ in range(count)]

    def close_sessions(self, session_ids: list[str]) -> None:
        """Free what each session holds, all at once where the engine can; an id the engine no
        longer knows (it restarted) holds nothing and is skipped."""
        for session_id in session_ids:
            self.close_session_quietly(session_id)

    def close_session_quietly(self, session_id: str) -> None:
        """``close_session``, skipping an id the engine no longer knows (it holds nothing)."""
        try:
            self.close_session(session_id)
        except (ValueError, RuntimeError):
            pass


class Engines(Backend):
    """This rank's rollout engines, whatever the topology. The defaults are what an engine that
    lacks the feature does (a server has no decode counters in this process, nothing to offload).

    generate      ``run`` / ``generate`` (a batch), ``submit`` (one request joins the running
                  batch) (``Backend``)
    sessions      ``has_sessions``, ``open_session()``, ``close_session(id)`` and their batched
                  ``open_sessions(count)``, ``close_sessions(ids)``: a request with
                  ``session_params`` continues its session's KV on the engine that holds it
    weights       ``update_weights(path, payload, urls)``: SGLang's ``/update_weights_from_*``
                  request (in-process: ``/update_weights_from_tensor`` with the tensors
                  themselves); returns the URLs lost. ``weight_sync.WeightSync`` buckets and
                  versions them through one of ``transports.TRANSPORTS``
    info          ``pool()``, ``context_length()``, ``decode_counters()``, ``fault_metrics()``,
                  ``gpu_uuids()``
    pause/resume  ``abort_all()`` (requests in flight end now), ``kv_memory()`` (the KV pool only
                  while generating), ``device_work(asynchronous)`` (the training thread's GPU work)
    health        ``on_engine_failure`` (the restart hook), ``wait_for_restarts()``
    close         ``close()``: what this object started, stopped
    """

    hosted = True  # False: this rank talks to no engine (NoEngines)
    over_http = False  # True: servers, which take every --weight-sync mode but ``inprocess``
    on_engine_failure: Callable[[str], "str | None"] | None = None  # HTTP engines restart through it

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def urls(self) -> list[str]:
        """The servers up now (none: the engine is in this process, or there is none)."""
        return []

    def update_weights(self, path: str, payload: dict, urls: list[str]) -> list[str]:
        """A weight update to the engines (``urls`` of them over HTTP): the URLs it lost."""
        raise RuntimeError(f"{self.name} takes no weight updates ({path})")

    def pool(self) -> dict | None:
        """The KV pool (``peak_used``, ``bytes_per_slot``, ``capacity``) or None (unknown)."""
        return None

    def gpu_uuids(self) -> list[str | None]:
        """The GPU of each server behind this door (None where one does not say): none here,
        where there is no server (the engine is in this process, or there is none).
        ``sync_choice`` keeps NCCL off a GPU the trainer holds too."""
        return []

    def context_length(self) -> int | None:
        return None

    def decode_counters(self) -> dict:
        return {}

    def fault_metrics(self) -> dict:
        return {}

    def abort_all(self) -> None:
        pass

    def kv_memory(self):
        return contextlib.nullcontext()

    def device_work(self, asynchronous: bool):
        return contextlib.nullcontext()

    def wait_for_restarts(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


class NoEngines(Engines):
    """A rank that hosts no engine and talks to none (it only trains): every operation is
    the default's no-op; it never generates (its placement gives it no shard)."""

    hosted = False


def engine_error(gen: Generation) -> str | None:
    """The engine's message when a step failure ended this sample (sglang-kvc's finish reason
    ``abort`` with ``status_code`` 500), else None. An abort by request (a weight push of partial
    rollouts, ``abort_request``) is not an engine error."""
    reason = gen.meta.get("finish_reason")
    if gen.finish_reason != "abort" or not isinstance(reason, dict):
        return None
    if reason.get("status_code") is None and reason.get("err_type") is None:
        return None
    return str(reason.get("message") or reason.get("err_type"))


def reissue_failed(run_once: Callable[[list["SampleRequest"]], list[Generation]],
                   requests: list["SampleRequest"], engine: str) -> list[Generation]:
    """``run_once(requests)``, then once more for the samples an engine failure ended (same seed:
    the same sample if the failure was transient); still failing, a ``RolloutError`` naming
    ``engine`` and the first error."""
    gens = run_once(requests)
    failed = [k for k, g in enumerate(gens) if engine_error(g)]
    if not failed:
        return gens
    log.warning("%s: %d of %d samples ended by an engine error (%s); re-issuing them once",
                engine, len(failed), len(gens), engine_error(gens[failed[0]]))
    for k, g in zip(failed, run_once([requests[k] for k in failed])):
        gens[k] = g
    still = [g for g in (gens[k] for k in failed) if engine_error(g)]
    if still:
        raise RolloutError(f"{engine}: {len(still)} of {len(gens)} samples failed twice; "
                           f"first error: {engine_error(still[0])}")
    return gens


def parse_output(out: dict, want_record: bool = False) -> Generation:
    meta = out.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = [int(p[1]) for p in pairs]
    finish = meta.get("finish_reason") or {}
    return Generation(ids, [float(p[0]) for p in pairs], out.get("text", ""),
                      finish.get("type", "unknown") if isinstance(finish, dict) else str(finish),
                      meta.get("weight_version"),
                      {k: v for k, v in meta.items()
                       if k not in ("output_token_logprobs", "eviction_record")},
                      eviction_record=_eviction_record(meta) if want_record else None)


def _eviction_record(meta: dict):
    """The record as a tensor: handed over as one in-process, base64 over HTTP."""
    if "eviction_record" not in meta:
        raise RuntimeError("the rollout engine returned no eviction_record: --sparse-recompute / "
                           "--train-sparse-policy need sglang-kvc engines (return_eviction_record)")
    from sglang_kvc import decode_eviction_record

    return decode_eviction_record(meta["eviction_record"])
