"""SGLang-API servers over HTTP (sglang-kvc or stock SGLang): a static ``--rollout-server-urls``
list, this run's engine processes (``processes.py``) or a Ray job's engine actors. It owns
failover: a request that fails goes to another engine, a dead engine goes to the restart hook
(``failover.py``), and a weight push that loses an engine goes on without it."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time

import requests

from .failover import AllEnginesDown, EngineSet, RestartHook
from .interface import Engines, Generation, RolloutConfig, SampleRequest, batch_body, parse_output
from .interface import reissue_failed
from .lifecycle import healthy
from .routing import Routes


MAX_SUBMITTED = 1024  # single requests in flight at once (threads are started as needed)
SESSION_CALLS = 32  # session opens/closes in flight at once


def _as_list(out, expected: int) -> list[dict]:
    """A batched response is a list, one result per sample (a server may answer a batch of one
    with the bare result)."""
    out = out if isinstance(out, list) else [out]
    if len(out) != expected:
        raise RuntimeError(f"/generate answered {len(out)} results for {expected} samples")
    return out


class _Transient(Exception):
    """A failed attempt that another attempt (maybe on another engine) may not repeat."""


class HTTPRollout(Engines):
    """One or more SGLang-API servers (sglang-kvc or stock SGLang), round-robin. A request that
    fails (connection error, timeout, 5xx) goes to another engine; an engine that does not answer
    ``/health`` is marked down and handed to ``on_engine_failure`` (``failover.py``). Every sample
    keeps its index and its ``sampling_seed`` wherever it runs, so a re-issued sample is the one
    the first engine would have produced. ``fault_metrics()`` counts what happened."""

    over_http = True

    def __init__(self, urls: list[str], timeout: float = 3600.0,
                 on_engine_failure: RestartHook | None = None, health_timeout: float = 5.0,
                 restart_wait: float = 600.0):
        if not urls:
            raise ValueError("--rollout-server-urls needs at least one URL")
        self.engines = EngineSet([u.rstrip("/") for u in urls], on_engine_failure, restart_wait)
        self.timeout, self.health_timeout = timeout, health_timeout
        self.session = requests.Session()
        # submit() keeps many single requests in flight: a kept connection for each
        self.session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=MAX_SUBMITTED))
        self.routes = Routes(self.engines.size)  # single requests: sticky by session id
        self._submitted: concurrent.futures.ThreadPoolExecutor | None = None  # submit()'s pool

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
        once = self._run_routed if any(r.session_params for r in requests) else self._run_once
        return reissue_failed(lambda reqs: once(reqs, cfg), requests,
                              f"rollout server(s) {', '.join(self.engines.urls)}")

    def _run_routed(self, requests: list[SampleRequest], cfg: RolloutConfig) -> list[Generation]:
        """Session requests, each on its session's server (``submit``)."""
        return [f.result() for f in [self.submit(r, cfg) for r in requests]]

    def submit(self, request: SampleRequest, cfg: RolloutConfig
               ) -> "concurrent.futures.Future[Generation]":
        """One request on its own ``/generate`` (the server batches it with those in flight):
        a session's on the server that holds it, others round-robin; failover as ``run``."""
        if self._submitted is None:  # as many samples in flight as run() would send at once
            per_server = cfg.concurrency * max(1, cfg.samples_per_request)
            self._submitted = concurrent.futures.ThreadPoolExecutor(
                min(MAX_SUBMITTED, per_server * self.engines.size), thread_name_prefix="http-submit")
        slot = self.routes.for_request(request.session_params)
        return self._submitted.submit(self._one, slot, request, cfg)

    def _one(self, slot: int, request: SampleRequest, cfg: RolloutConfig) -> Generation:
        out = self._request(slot, batch_body([request], cfg), cfg.retries, threading.Event())
        return parse_output(_as_list(out, 1)[0], cfg.eviction_record)

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

    has_sessions = True  # on any number of servers: a session's requests go where it was opened

    def open_session(self) -> str:
        """A session on the next server in turn; its requests all go there (``routes``)."""
        slot = self.routes.next_slot()
        session_id = self.post(self.engines.urls[slot] + "/open_session", {"capacity_of_str_len": 0})
        self.routes.open(session_id, slot)
        return session_id

    def close_session(self, session_id: str) -> None:
        slot = self.routes.close(session_id)
        if slot is None:
            raise ValueError(f"session {session_id!r} is not open on any rollout server")
        self.post(self.engines.urls[slot] + "/close_session", {"session_id": session_id})

    def open_sessions(self, count: int) -> list[str]:
        """``count`` sessions, spread over the servers in turn, opened concurrently."""
        return _concurrently(lambda _: self.open_session(), range(count))

    def close_sessions(self, session_ids: list[str]) -> None:
        """Closed concurrently; one a server no longer knows (it restarted) is skipped."""
        _concurrently(self.close_session_quietly, session_ids)

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

    def update_weights(self, path: str, payload: dict, urls: list[str]) -> list[str]:
        """A weight update's request to ``urls``: the URLs of the engines it lost (failed and
        silent on ``/health``: handed to failover, restarted by the hook); see
        ``call_surviving``."""
        return [self.engines.urls[s] for s in self.call_surviving(path, payload, urls)]

    def alive(self, url: str) -> bool:
        return self._healthy(url)

    def lose(self, url: str, why: str) -> None:
        """The engine at ``url`` is dead (found by a weight push): failover restarts it."""
        if url in self.engines.urls:  # else already replaced
            self.engines.failed(self.engines.urls.index(url), url, why)

    def pool(self) -> dict | None:
        """The fullest server's KV pool (its peak since start: a server keeps no per-rollout
        peak); None where no server says."""
        pools = [i["kv_pool"] for i in map(_server_info, self.urls) if i and "kv_pool" in i]
        if not pools:
            return None
        pool = max(pools, key=lambda p: p["peak_used"])
        return {k: pool[k] for k in ("peak_used", "bytes_per_slot", "capacity")}

    def gpu_uuids(self) -> list[str | None]:
        """Each server's GPU (sglang-kvc's ``gpu_uuid``; None where a server does not say, or
        runs on a CPU): ``sync_choice`` keeps NCCL off a GPU the trainer holds too."""
        return [(_server_info(u) or {}).get("gpu_uuid") for u in self.urls]

    def context_length(self) -> int | None:
        info = _server_info(self.urls[0]) or {}
        try:
            return int(info["context_length"])
        except (KeyError, TypeError, ValueError):  # a stock server may not say: no clamping
            return None

    def abort_all(self) -> None:
        self.call("/abort_request", {"abort_all": True})

    def close(self) -> None:
        if self._submitted is not None:
            self._submitted.shutdown(wait=False, cancel_futures=True)

    def call(self, path: str, payload: dict | None = None, urls: list[str] | None = None
             ) -> list[dict]:
        """POST a control request (weight updates, memory release, ...) to every server up (or to
        ``urls``), all at once."""
        urls = self.urls if urls is None else urls
        if not urls:
            raise AllEnginesDown(f"no rollout engine is up to take {path}")
        with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
            return list(pool.map(lambda u: self.post(u + path, payload or {}), urls))


def _server_info(url: str) -> dict | None:
    """A server's /get_server_info, or None (a stock server may not say; metrics only)."""
    try:
        return requests.get(url + "/get_server_info", timeout=10).json()
    except Exception:  # noqa: BLE001 - a pool metric is never worth failing a rollout for
        return None


def _concurrently(fn, items) -> list:
    """``fn`` over ``items`` on up to ``SESSION_CALLS`` threads, in order (short control
    requests: one after another, each would wait for its server's step boundary)."""
    items = list(items)
    if not items:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(SESSION_CALLS, len(items)),
                                               thread_name_prefix="http-session") as pool:
        return list(pool.map(fn, items))
