"""Rollout backends: the in-process sglang-kvc engine, or SGLang-API servers over HTTP.

Both return, per sample, the response token ids, the sampler's log-prob of each token (π_sparse:
computed over the compressed KV cache when compression is on), the finish reason, the weight
version that produced it and the engine's compression statistics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import time

import requests
from tqdm import tqdm


@dataclasses.dataclass
class RolloutConfig:
    max_response_len: int = 1024  # --rollout-max-response-len
    temperature: float = 1.0  # --rollout-temperature
    top_p: float = 1.0  # --rollout-top-p
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    seed: int | None = None  # per-sample sampling_seed = seed + sample index when set
    concurrency: int = 64  # in-flight HTTP requests per server
    retries: int = 3


@dataclasses.dataclass
class Generation:
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    weight_version: str | None
    meta: dict


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


def parse_output(out: dict) -> Generation:
    meta = out.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = [int(p[1]) for p in pairs]
    finish = meta.get("finish_reason") or {}
    return Generation(ids, [float(p[0]) for p in pairs], out.get("text", ""),
                      finish.get("type", "unknown") if isinstance(finish, dict) else str(finish),
                      meta.get("weight_version"),
                      {k: v for k, v in meta.items() if k != "output_token_logprobs"})


class EngineRollout:
    """An in-process engine, colocated with this rank's part of the trainer."""

    def __init__(self, engine, progress: bool = False):
        self.engine = engine
        self.progress = progress  # a bar of finished samples (one rank shows it)

    def generate(self, prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                 ) -> list[Generation]:
        from sglang_kvc.io_struct import parse_generate

        input_ids, params = [], []
        for i, ids in enumerate(prompts):
            for j in range(n):
                seed = None if cfg.seed is None else cfg.seed + i * n + j
                input_ids.append(list(ids))
                params.append(_sampling_params(cfg, seed, **overrides))
        body = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
        items, _ = parse_generate(body, self.engine.sampling_defaults)
        futures = self.engine.submit(items)
        with tqdm(total=len(input_ids), desc="generate", unit="sample", leave=False,
                  disable=not self.progress, mininterval=1.0) as bar:
            for _ in concurrent.futures.as_completed(futures):
                bar.update()
        return [parse_output(f.result()) for f in futures]


class HTTPRollout:
    """One or more SGLang-API servers (sglang-kvc or stock SGLang), round-robin, with retries."""

    def __init__(self, urls: list[str], timeout: float = 3600.0):
        if not urls:
            raise ValueError("--rollout-server-urls needs at least one URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        self.session = requests.Session()

    def _post(self, url: str, payload: dict, retries: int) -> dict:
        for attempt in range(retries + 1):
            try:
                r = self.session.post(url, json=payload, timeout=self.timeout)
                if r.status_code < 500:
                    r.raise_for_status()  # 4xx: our request is wrong, retrying will not help
                    return r.json()
                err = f"HTTP {r.status_code}: {r.text[:200]}"
            except (requests.ConnectionError, requests.Timeout) as e:
                err = str(e)
            if attempt < retries:
                time.sleep(min(2 ** attempt, 10))
        raise RuntimeError(f"{url}: failed after {retries + 1} attempts: {err}")

    def generate(self, prompts: list[list[int]], n: int, cfg: RolloutConfig, **overrides
                 ) -> list[Generation]:
        jobs = []
        servers = itertools.cycle(self.urls)
        for i, ids in enumerate(prompts):
            for j in range(n):
                seed = None if cfg.seed is None else cfg.seed + i * n + j
                payload = {"input_ids": ids, "return_logprob": True,
                           "sampling_params": _sampling_params(cfg, seed, **overrides)}
                jobs.append((next(servers) + "/generate", payload))
        workers = max(1, cfg.concurrency * len(self.urls))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            outs = list(pool.map(lambda job: self._post(*job, cfg.retries), jobs))
        return [parse_output(o) for o in outs]

    def call(self, path: str, payload: dict | None = None) -> list[dict]:
        """POST a control request to every server (weight updates, memory release, ...)."""
        return [self._post(u + path, payload or {}, retries=1) for u in self.urls]
