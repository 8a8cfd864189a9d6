"""Rollout backends: the in-process sglang-kvc engine, or SGLang-API servers over HTTP.

Both return, per sample, the response token ids, the sampler's log-prob of each token (π_sparse:
computed over the compressed KV cache when compression is on), the finish reason, the weight
version that produced it and the engine's compression statistics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable

import requests
from tqdm import tqdm

from .failover import AllEnginesDown, EngineSet, RestartHook
from .lifecycle import healthy

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
            "return_logprob": True, **_kv_fields(cfg), **_per_sample_compress(requests, cfg)}


def _per_sample_compress(requests: list[SampleRequest], cfg: RolloutConfig) -> dict:
    """A mixed batch (dense share) says per sample which ones compress."""
    if all(r.compress for r in requests):
        return {}
    return {"compress": [cfg.compress and r.compress for r in requests]}


class Backend:
    """What the rollout needs of an engine: ``run`` a list of sample requests, in order."""

    def run(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                 ) -> list[Generation]:
        return self.run(sample_requests(prompts, n, cfg, **overrides), cfg)


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


class EngineRollout(Backend):
    """An in-process engine, colocated with this rank's part of the trainer."""

    def __init__(self, engine, progress: bool = False):
        self.engine = engine
        self.progress = progress  # a bar of finished samples (one rank shows it)

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
        with tqdm(total=len(requests), desc="generate", unit="sample", leave=False,
                  disable=not self.progress, mininterval=1.0) as bar:
            for _ in concurrent.futures.as_completed(futures):
                bar.update()
        return [parse_output(f.result(), cfg.eviction_record) for f in futures]


def _as_list(out, expected: int) -> list[dict]:
    """A batched response is a list, one result per sample (a server may answer a batch of one
    with the bare result)."""
    out = out if isinstance(out, list) else [out]
    if len(out) != expected:
        raise RuntimeError(f"/generate answered {len(out)} results for {expected} samples")
    return out


class _Transient(Exception):
    """A failed attempt that another attempt (maybe on another engine) may not repeat."""


class HTTPRollout(Backend):
    """One or more SGLang-API servers (sglang-kvc or stock SGLang), round-robin. A request that
    fails (connection error, timeout, 5xx) goes to another engine; an engine that does not answer
    ``/health`` is marked down and handed to ``on_engine_failure`` (``failover.py``). Every sample
    keeps its index and its ``sampling_seed`` wherever it runs, so a re-issued sample is the one
    the first engine would have produced. ``fault_metrics()`` counts what happened."""

    def __init__(self, urls: list[str], timeout: float = 3600.0,
                 on_engine_failure: RestartHook | None = None, health_timeout: float = 5.0,
                 restart_wait: float = 600.0):
        if not urls:
            raise ValueError("--rollout-server-urls needs at least one URL")
        self.engines = EngineSet([u.rstrip("/") for u in urls], on_engine_failure, restart_wait)
        self.timeout, self.health_timeout = timeout, health_timeout
        self.session = requests.Session()

    @property
    def urls(self) -> list[str]:
        """The engines up now (weight pushes go to these)."""
        return self.engines.live()

    @property
    def on_engine_failure(self) -> RestartHook | None:
        return self.engines.on_failure

    @on_engine_failure.setter
    def on_engine_failure(self, hook: RestartHook | None) -> None:
        self.engines.on_failure = hook

    def fault_metrics(self) -> dict[str, float]:
        """``rollout/requests_reissued``, ``rollout/engine_failures``, ``rollout/engine_restarts``
        since the previous call."""
        return self.engines.take_counts().metrics()

    def wait_for_restarts(self, timeout: float | None = None) -> bool:
        return self.engines.wait_for_restarts(timeout)

    def run(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        """The samples as batched ``/generate`` requests, round-robin over the engines, up to
        ``cfg.concurrency`` requests in flight per engine; a failed request is re-issued whole,
        and samples that an engine's step failure ended (HTTP 200, finish reason ``abort``
        with status 500) once more."""
        return reissue_failed(lambda reqs: self._run_once(reqs, cfg), requests,
                              f"rollout server(s) {', '.join(self.engines.urls)}")

    def _run_once(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        chunks = self._chunks(len(requests), max(1, cfg.samples_per_request))
        stop = threading.Event()  # one request failed for good: the others stop waiting
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(
            len(chunks), cfg.concurrency * self.engines.size)))
        try:
            futures = [pool.submit(self._request, slot, batch_body([requests[k] for k in ks], cfg),
                                   cfg.retries, stop) for slot, ks in chunks]
            outs = [_as_list(f.result(), len(ks)) for f, (_, ks) in zip(futures, chunks)]
        except BaseException:
            stop.set()
            raise
        finally:
            pool.shutdown(wait=not stop.is_set(), cancel_futures=True)
        by_index = {k: o for (_, ks), out in zip(chunks, outs) for k, o in zip(ks, out)}
        return [parse_output(by_index[k], cfg.eviction_record) for k in range(len(requests))]

    def _chunks(self, count: int, per_request: int) -> list[tuple[int, list[int]]]:
        """(engine slot, sample indices) per request: sample ``k`` goes to engine
        ``k % engines``, each engine's share cut into requests of at most ``per_request``,
        interleaved so that every engine gets work first."""
        size = self.engines.size
        shares = [list(range(slot, count, size)) for slot in range(size)]
        cuts = [[(slot, share[i:i + per_request]) for i in range(0, len(share), per_request)]
                for slot, share in enumerate(shares)]
        return [c for wave in itertools.zip_longest(*cuts) for c in wave if c]

    def _request(self, slot: int, payload: dict, retries: int, stop: threading.Event):
        """One request: its slot's engine, or the next one up after each failure."""
        failures = 0
        while True:
            slot, url = self.engines.pick(slot, stop)
            try:
                return self._send(url + "/generate", payload)
            except _Transient as e:
                failures += 1
                # a budget per request: a request that kills every engine it touches must end
                if failures > retries + self.engines.size or stop.is_set():
                    raise RuntimeError(f"{url}/generate: failed after {failures} attempts: "
                                       f"{e}") from e
                self._failed(slot, url, str(e), failures)
                self.engines.reissued()
                slot += 1

    def _failed(self, slot: int, url: str, error: str, failures: int) -> None:
        if self._healthy(url):
            time.sleep(min(2 ** (failures - 1), 10))  # up but failing: let it breathe
        else:
            self.engines.failed(slot, url, error)

    def _healthy(self, url: str) -> bool:
        return healthy(url, self.health_timeout)

    def _send(self, url: str, payload: dict) -> dict:
        try:
            r = self.session.post(url, json=payload, timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout) as e:
            raise _Transient(str(e)) from e
        if r.status_code >= 500:
            raise _Transient(f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code >= 400:  # our request is wrong: no engine will take it
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else {}  # /abort_request answers an empty 200, as SGLang

    def post(self, url: str, payload: dict, retries: int = 1) -> dict:
        """One control request to one server, retried there (no failover: it is about that one)."""
        for attempt in range(retries + 1):
            try:
                return self._send(url, payload)
            except _Transient as e:
                err = str(e)
            if attempt < retries:
                time.sleep(min(2 ** attempt, 10))
        raise RuntimeError(f"{url}: failed after {retries + 1} attempts: {err}")

    def call_surviving(self, path: str, payload: dict, urls: list[str]) -> list[int]:
        """``call``, except that an engine which fails the request and does not answer
        ``/health`` is marked down (restarted by ``on_engine_failure``) instead of failing the
        call; returns the slots of those engines. A live engine's error still raises."""
        def one(url: str) -> int | None:
            try:
                self.post(url + path, payload)
                return None
            except RuntimeError as e:
                if self._healthy(url):
                    raise
                slot = self.engines.urls.index(url)
                self.engines.failed(slot, url, f"{path}: {e}")
                return slot

        if not urls:
            return []
        with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
            return [s for s in pool.map(one, urls) if s is not None]

    def call(self, path: str, payload: dict | None = None, urls: list[str] | None = None
             ) -> list[dict]:
        """POST a control request (weight updates, memory release, ...) to every server up (or to
        ``urls``), all at once."""
        urls = self.urls if urls is None else urls
        if not urls:
            raise AllEnginesDown(f"no rollout engine is up to take {path}")
        with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
            return list(pool.map(lambda u: self.post(u + path, payload or {}), urls))
